#!/usr/bin/env bash
# A cross-encoder reranker from all-MiniLM-L6-v2 on SQuAD train (bert/tasks/rerank.py, `squad:`): each question
# against the sentences of its paragraph (the one holding the answer is relevant) and the 4 sentences of its
# article's other paragraphs that share most words with it; the first 9,000 questions (spread over all articles),
# about one pass at 2,500 steps of 32 pairs. Held out: the last 10 articles, never trained on.
# Measure: python -m evals.rerank_quality --reranker "$OUT/best"   (docs/benchmarks.md, "Reranking")
set -euo pipefail
OUT=${OUT:-runs/rerank-squad}
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
$PY -m training.finetune --task rerank --ckpt "$MINILM" \
  --train-data "squad:$DATA/squad-train" --heldout-articles 10 --max-train-examples ${QUESTIONS:-9000} --max-eval-examples 300 \
  --output-dir "$OUT" --max-seq-length 96 --batch-size 32 --learning-rate 5e-5 --warmup-steps 100 \
  --max-steps ${STEPS:-2500} --eval-every 250 --log-every 20 --precision ${PRECISION:-bf16} \
  --torch-threads ${THREADS:-0} "$@"
