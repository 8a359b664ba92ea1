#!/bin/sh
# Entrypoint of the bertserve images (docker/README.md).
#
# With BERTSERVE_BACKEND=tensorrt, a TensorRT engine is only valid for the GPU model and the
# TensorRT version it was built with, so it is built here, on the machine that will run it, and
# kept in the cache volume under a key of (onnx hash, GPU name, TensorRT version). Later starts on
# the same kind of GPU find it and skip the build (minutes). The server is then pointed at a
# directory in the cache that holds the artifact's files plus the engine as model.plan.
#
# Arguments starting with "-" are passed to the server; any other command runs instead of it
# (e.g. `docker run -it IMAGE bash`).
set -eu

PYTHON="${PYTHON:-python3}"
CACHE="${BERTSERVE_ENGINE_CACHE:-/cache}"

if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi

log() { echo "entrypoint: $*" >&2; }

gpu_name() {
    # Through the CUDA driver, so CUDA_VISIBLE_DEVICES is honoured; nvidia-smi as a fallback.
    "$PYTHON" - <<'PY' 2>/dev/null || nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
device, name = ctypes.c_int(), ctypes.create_string_buffer(256)
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuDeviceGetName(name, 256, device) == 0
print(name.value.decode())
PY
}

prepare_tensorrt_engine() {
    model="${BERTSERVE_MODEL:?BERTSERVE_BACKEND=tensorrt needs BERTSERVE_MODEL: an artifact directory with model.onnx}"
    # export.onnx writes model.portable.onnx (standard ops only) for TensorRT beside the
    # onnxruntime-fused model.onnx; older or hand-made artifacts have model.onnx alone.
    onnx="$model/model.portable.onnx"
    if [ ! -f "$onnx" ]; then
        onnx="$model/model.onnx"
    fi
    if [ ! -f "$onnx" ]; then
        log "no model.portable.onnx or model.onnx in $model: serving it as it is"
        return
    fi
    gpu="$(gpu_name)"
    if [ -z "$gpu" ]; then
        log "BERTSERVE_BACKEND=tensorrt but no GPU is visible (is the container run with --gpus?)"
        exit 1
    fi
    trt="$("$PYTHON" -c 'import tensorrt; print(tensorrt.__version__)')"
    onnx_hash="$(sha256sum "$onnx" | cut -c1-16)"
    key="$(printf '%s' "$(basename "$model")-$onnx_hash/$gpu-trt$trt" | tr -c 'A-Za-z0-9._/-' '_')"
    engine_dir="$CACHE/engines/$key"
    mkdir -p "$engine_dir"
    # Several replicas may share the volume: one builds, the others wait for its engine.
    exec 9>"$engine_dir/.lock"
    if command -v flock >/dev/null 2>&1; then
        flock 9
    fi
    if [ -s "$engine_dir/model.plan" ]; then
        log "cached engine for $gpu / TensorRT $trt: $engine_dir/model.plan"
    else
        log "building TensorRT engine for $gpu / TensorRT $trt (this takes minutes) ..."
        # Built beside the cache entry and moved in whole, so a killed build leaves no half engine.
        # --out may name the plan file or a directory that receives model.plan: both are handled.
        partial="$engine_dir/.partial"
        rm -rf "$partial"
        # shellcheck disable=SC2086  # BERTSERVE_TRT_BUILD_ARGS is a list of flags
        "$PYTHON" -m export.tensorrt --onnx "$onnx" --out "$partial" ${BERTSERVE_TRT_BUILD_ARGS:-}
        if [ -d "$partial" ]; then
            mv "$partial/model.plan" "$engine_dir/model.plan"
            rm -rf "$partial"
        else
            mv "$partial" "$engine_dir/model.plan"
        fi
        log "engine written to $engine_dir/model.plan"
    fi
    exec 9>&-
    # The artifact is checked against its manifest here, before its files are linked beside the engine: the
    # engine directory's manifest does not list the plan built on this machine, so the server is told to take
    # that directory as it is (the plan was moved into the cache whole, above).
    "$PYTHON" -c 'import sys
from runtime.artifact import verify_artifact
from runtime.model_dir import ModelError, read_model_spec
try:
    verify_artifact(read_model_spec(__import__("pathlib").Path(sys.argv[1])))
except ModelError as e:
    sys.exit(f"error: {e}")' "$model"
    # The artifact's tokenizer, config and manifest next to the engine, as one model directory.
    for file in "$model"/*; do
        name="$(basename "$file")"
        if [ "$name" != "model.plan" ]; then
            ln -sfn "$file" "$engine_dir/$name"
        fi
    done
    export BERTSERVE_MODEL="$engine_dir"
    export BERTSERVE_ALLOW_UNVERIFIED=1
}

if [ "${BERTSERVE_BACKEND:-}" = "tensorrt" ]; then
    prepare_tensorrt_engine
fi

exec "$PYTHON" -m serving "$@"
