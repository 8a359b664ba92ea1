#!/usr/bin/env bash
# SQuAD v1.1 smoke run on CPU (a full epoch is ~3.6 h on 2 cores): all-MiniLM-L6-v2, 50 steps,
# evaluated on the held-out last 10 articles of the training parts (never trained on).
set -euo pipefail
OUT=${OUT:-runs/squad-smoke}
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
nice -n 5 $PY -m training.finetune --task qa --ckpt "$MINILM" \
  --train-data "$DATA/squad-train" --heldout-articles 10 \
  --output-dir "$OUT" --max-seq-length 384 --doc-stride 128 --max-query-length 64 \
  --batch-size 16 --learning-rate 1e-4 --max-steps ${STEPS:-50} --max-train-examples ${TRAIN_EXAMPLES:-2000} \
  --max-eval-examples ${EVAL_EXAMPLES:-300} --log-every 10 --torch-threads ${THREADS:-1} "$@"
