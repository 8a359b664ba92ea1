#!/usr/bin/env bash
# Pretrain BERT-mini (L4/H256) from scratch on WikiText-2 (test split) with its own WordPiece vocabulary.
# Bar (CPU, ~20 minutes): held-out MLM accuracy >= 10 %, NSP accuracy >= 65 %.
set -euo pipefail
OUT=${OUT:-runs/pretrain-mini}
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
# 1. WikiText raw (paragraph lines, " = Title = " headings, CRLF) -> one sentence per line, blank line between articles
$PY -m training.data.wikitext "$DATA/wikitext-2-raw/wiki.test.raw" "$OUT/wiki.test.corpus.txt"
# 2. vocabulary (trained on the corpus) + instances (built once, then reused) + training
nice -n 5 $PY -m training.pretrain --corpus "$OUT/wiki.test.corpus.txt" --vocab-size ${VOCAB:-8000} \
  --preset mini --output-dir "$OUT" --max-seq-length ${SEQ:-128} --max-predictions-per-seq 20 \
  --dupe-factor 5 --heldout-percent 10 --batch-size ${BATCH:-32} --learning-rate ${LR:-1e-3} --warmup-steps 100 \
  --max-steps ${STEPS:-1400} --eval-every 200 --log-every 20 --max-eval-instances 1000 --torch-threads ${THREADS:-2} "$@"
