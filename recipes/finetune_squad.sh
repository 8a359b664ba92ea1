#!/usr/bin/env bash
# Full SQuAD v1.1 fine-tuning (2 epochs; GPU recommended, ~3.6 h/epoch on 2 CPU cores).
# Held-out evaluation: the last 10 articles of the training parts (train-v1.1.part-04), never trained on.
set -euo pipefail
OUT=${OUT:-runs/squad-minilm}
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
$PY -m training.finetune --task qa --ckpt "$MINILM" \
  --train-data "$DATA/squad-train" --heldout-articles 10 \
  --output-dir "$OUT" --max-seq-length 384 --doc-stride 128 --max-query-length 64 \
  --batch-size 32 --learning-rate 1e-4 --num-epochs 2 --eval-every 1000 --log-every 20 "$@"
