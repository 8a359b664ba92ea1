#!/usr/bin/env bash
# Pretrain a small DeBERTa-v3 (L4/H128, relative attention, no absolute positions, no token types) from scratch on
# WikiText-2 (test split) with masked LM alone and its own Unigram vocabulary, fine-tune SST-2 from it, export it,
# serve the export and compare the served /classify answers with transformers' text-classification pipeline on
# the same weights (evals.pipeline_parity). CPU, minutes; figures in docs/training.md.
set -euo pipefail
OUT=${OUT:-runs/pretrain-deberta}
MINILM_OPTIONAL=1
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"
THREADS=${THREADS:-1}  # one torch thread: two contend badly on a shared 2-core machine
# 1. WikiText raw -> one sentence per line, blank line between articles
$PY -m training.data.wikitext "$DATA/wikitext-2-raw/wiki.test.raw" "$OUT/wiki.test.corpus.txt"
# 2. the architecture: DeBERTa-v3's settings at a small size (vocab_size follows the trained vocabulary)
cat >"$OUT/deberta-v3-small.json" <<JSON
{"model_type": "deberta-v2", "hidden_size": ${HIDDEN:-128}, "num_hidden_layers": ${LAYERS:-4},
 "num_attention_heads": 4, "intermediate_size": $((4 * ${HIDDEN:-128})), "max_position_embeddings": 512,
 "relative_attention": true, "pos_att_type": ["p2c", "c2p"], "position_buckets": 256, "max_relative_positions": -1,
 "norm_rel_ebd": "layer_norm", "share_att_key": true, "position_biased_input": false, "type_vocab_size": 0,
 "pad_token_id": 0, "hidden_act": "gelu", "layer_norm_eps": 1e-7}
JSON
# 3. Unigram vocabulary + MLM-only instances + training
nice -n 5 $PY -m training.pretrain --corpus "$OUT/wiki.test.corpus.txt" --vocab-size ${VOCAB:-8000} \
  --vocab-model unigram --preset "$OUT/deberta-v3-small.json" --no-nsp --output-dir "$OUT/pretrain" \
  --max-seq-length ${SEQ:-64} --max-predictions-per-seq 10 --dupe-factor 5 --heldout-percent 10 \
  --batch-size ${BATCH:-32} --learning-rate ${LR:-1e-3} --warmup-steps 50 --max-steps ${STEPS:-400} \
  --eval-every 200 --log-every 20 --max-eval-instances 1000 --torch-threads "$THREADS"
# 4. SST-2 from the pretrained encoder
nice -n 5 $PY -m training.finetune --task classify --ckpt "$OUT/pretrain/best" \
  --train-data "$DATA/SST-2/train.tsv" --eval-data "$DATA/SST-2/dev.tsv" --labels 0,1 --label-names negative,positive \
  --output-dir "$OUT/sst2" --max-seq-length 64 --batch-size 32 --learning-rate ${FT_LR:-3e-4} \
  --max-steps ${FT_STEPS:-400} --warmup-ratio 0.06 --eval-every 200 --log-every 50 --torch-threads "$THREADS"
# 5. export fp32 and the default (auto: int8 where it keeps fp32's answers and is faster), serve the checkpoint and
#    each export, and compare with transformers' pipeline on the same weights
nice -n 5 $PY -m export.onnx --ckpt "$OUT/sst2/best" --precision fp32 --out "$OUT/onnx-fp32"
nice -n 5 $PY -m export.onnx --ckpt "$OUT/sst2/best" --out "$OUT/onnx"
nice -n 5 $PY -m evals.pipeline_parity --ckpt "$OUT/sst2/best" --artifact "$OUT/onnx-fp32" --artifact "$OUT/onnx" \
  --json "$OUT/pipeline_parity.json"
