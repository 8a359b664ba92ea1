#!/bin/sh
# Submit an embed job to the Ray cluster of deploy/ray/cluster.yaml (or any cluster whose nodes have bertserve
# installed with its ray extra). The input and output paths must be mounted on every node.
#   RAY_ADDRESS=http://HEAD:8265 deploy/ray/submit.sh /mnt/shared/corpus /mnt/shared/vectors /mnt/shared/minilm-int8
set -eu
input=${1:?input: a Parquet/JSONL/CSV file, directory or glob on the shared filesystem}
output=${2:?output directory on the shared filesystem}
model=${3:?model: a checkpoint or export artifact directory on the shared filesystem}
task=${TASK:-embed}
workers=${WORKERS:-0} # 0: one model-holding actor per CPU of the cluster

exec ray job submit --address "${RAY_ADDRESS:-http://127.0.0.1:8265}" -- \
	python -m batch --task "$task" --model "$model" --input "$input" --output "$output" \
	--workers "$workers" --ray auto
