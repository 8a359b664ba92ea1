#!/usr/bin/env bash
# Fine-tune all-MiniLM-L6-v2 on SST-2 (CPU, ~1 epoch). Bar: dev accuracy >= 88.0.
set -euo pipefail
OUT=${OUT:-runs/sst2-minilm}
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
nice -n 5 $PY -m training.finetune --task classify --ckpt "$MINILM" \
  --train-data "$DATA/SST-2/train.tsv" --eval-data "$DATA/SST-2/dev.tsv" \
  --labels 0,1 --label-names negative,positive \
  --output-dir "$OUT" --max-seq-length 64 --batch-size 32 --learning-rate 1e-4 --num-epochs 1 \
  --warmup-ratio 0.06 --eval-every 300 --log-every 20 --torch-threads ${THREADS:-1} "$@"
