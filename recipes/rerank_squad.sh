#!/usr/bin/env bash
# A cross-encoder reranker from all-MiniLM-L6-v2 on SQuAD train, trained on the distractors it meets in search:
# 1. python -m training.mine_rerank: for each question of ARTICLES training articles (spread over all of them),
#    the sentences of its article that all-MiniLM-L6-v2 ranks highest, the answer's sentence left out (hard
#    negatives; evals.rerank_quality reranks that bi-encoder's top 20). Kept in $MINED: a rerun does not mine again.
# 2. finetune --task rerank --rerank-mined: each question against its answer's sentence and its NEGATIVES hardest
#    mined ones, a listwise loss (softmax cross-entropy over the 1 + NEGATIVES candidates), 32 pairs a step;
#    held-out MRR every EVAL_EVERY steps in $OUT/log.jsonl (the learning curve), last/ with each evaluation.
#    A rerun resumes from $OUT/last. Held out: the last 10 articles, never mined or trained on.
# Measure: python -m evals.rerank_quality --reranker "$OUT/best"   (docs/benchmarks.md, "Reranking")
# On a GPU (mining runs there too, --device auto): ARTICLES=0 QUESTIONS=0 recipes/rerank_squad.sh --batch-size 256
#   --learning-rate 1e-4 --warmup-steps 300 mines all 85,348 training questions and trains 3,000 steps of 32 queries
#   (docs/benchmarks.md, "Reranking": 3 min on one H200).
set -euo pipefail
OUT=${OUT:-runs/rerank-mined}
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
MINED=${MINED:-$OUT/mined.json}
$PY -m training.mine_rerank --squad "$DATA/squad-train" --heldout-articles 10 --articles "${ARTICLES:-120}" \
  --depth 19 --model "$MINILM" --threads "${THREADS:-0}" --out "$MINED"
RESUME=()
if [[ -d $OUT/last || -d $OUT/last.old ]]; then RESUME=(--resume "$OUT/last"); fi
$PY -m training.finetune --task rerank --ckpt "$MINILM" \
  --train-data "squad:$DATA/squad-train" --heldout-articles 10 --rerank-mined "$MINED" \
  --rerank-negatives "${NEGATIVES:-7}" --rerank-loss listwise --max-train-examples "${QUESTIONS:-0}" \
  --max-eval-examples 300 --output-dir "$OUT" --max-seq-length 96 --batch-size 32 --learning-rate 5e-5 \
  --warmup-steps 100 --max-steps "${STEPS:-3000}" --eval-every "${EVAL_EVERY:-300}" --log-every 20 \
  --precision "${PRECISION:-bf16}" --torch-threads "${THREADS:-0}" --no-progress "${RESUME[@]}" "$@"
