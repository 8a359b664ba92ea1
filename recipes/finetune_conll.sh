#!/usr/bin/env bash
# Fine-tune all-MiniLM-L6-v2 on CoNLL-2003 NER (CPU, 3 epochs). Bar: valid entity F1 >= 87.0.
set -euo pipefail
OUT=${OUT:-runs/conll-minilm}
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
nice -n 5 $PY -m training.finetune --task ner --ckpt "$MINILM" \
  --train-data "$DATA/conll2003/train.txt" --eval-data "$DATA/conll2003/valid.txt" \
  --output-dir "$OUT" --max-seq-length 128 --batch-size 32 --learning-rate 1e-4 --num-epochs 3 \
  --warmup-ratio 0.1 --log-every 20 --torch-threads ${THREADS:-1} "$@"
