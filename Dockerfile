# syntax=docker/dockerfile:1
#
# bertserve server images. Two targets:
#   cpu  python:3.11-slim + bertserve[serve] (onnxruntime on CPU, no torch)
#        docker build --target cpu -t bertserve:cpu .
#   gpu  NVIDIA's TensorRT image + bertserve[serve] with onnxruntime-gpu; with
#        BERTSERVE_BACKEND=tensorrt the entrypoint builds the engine for the GPU it runs on
#        docker build --target gpu -t bertserve:gpu .
# Configuration is by BERTSERVE_* environment variables (the server's pydantic-settings), e.g.
#   docker run -p 8000:8000 -v "$PWD/artifacts/sst2:/models/sst2:ro" -e BERTSERVE_MODEL=/models/sst2 bertserve:cpu
# The image holds no model: BERTSERVE_MODEL must name a mounted artifact (or checkpoint) directory.
#
# Keep TENSORRT_IMAGE and ONNXRUNTIME_GPU_VERSION in step: onnxruntime-gpu 1.22 is built against
# TensorRT 10.9 and CUDA 12.x, which the 25.03 TensorRT container ships.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG TENSORRT_IMAGE=nvcr.io/nvidia/tensorrt:25.03-py3

# ---- wheel: bertserve built once, so the runtime stages carry neither the source tree nor build tools
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bert/ bert/
COPY training/ training/
COPY export/ export/
COPY serving/ serving/
# serve.txt names the wheel with its [serve] extra, for `pip install -r` in the stages below.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && printf 'bertserve[serve] @ file://%s\n' /wheels/bertserve-*.whl > /wheels/serve.txt

# ---- cpu: ONNX Runtime on CPU
FROM ${PYTHON_IMAGE} AS cpu
LABEL org.opencontainers.image.title="bertserve" \
      org.opencontainers.image.description="Batched BERT inference server (classify, NER, QA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    BERTSERVE_HOST=0.0.0.0 \
    BERTSERVE_PORT=8000 \
    BERTSERVE_ENGINE_CACHE=/cache
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/bertserve bertserve \
    && mkdir -p /cache \
    && chown bertserve:bertserve /cache
COPY --from=wheel /wheels /wheels
# The [serve] extra brings onnxruntime and no torch.
RUN pip install --no-cache-dir --requirement /wheels/serve.txt \
    && rm -rf /wheels
COPY --chmod=755 docker/entrypoint.sh /usr/local/bin/bertserve-entrypoint
COPY --chmod=644 docker/healthcheck.py /usr/local/lib/bertserve/healthcheck.py
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/bertserve
VOLUME ["/cache"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "/usr/local/lib/bertserve/healthcheck.py"]
ENTRYPOINT ["/usr/local/bin/bertserve-entrypoint"]
CMD []

# ---- gpu: TensorRT + ONNX Runtime on CUDA
FROM ${TENSORRT_IMAGE} AS gpu
LABEL org.opencontainers.image.title="bertserve" \
      org.opencontainers.image.description="Batched BERT inference server (classify, NER, QA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG ONNXRUNTIME_GPU_VERSION=1.22.0
# The base image's Python is the system one (Ubuntu 24.04, PEP 668): pip may install into it here.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    BERTSERVE_DEVICE=cuda \
    BERTSERVE_HOST=0.0.0.0 \
    BERTSERVE_PORT=8000 \
    BERTSERVE_ENGINE_CACHE=/cache
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/bertserve bertserve \
    && mkdir -p /cache \
    && chown bertserve:bertserve /cache
COPY --from=wheel /wheels /wheels
# onnxruntime (CPU, from [serve]) and onnxruntime-gpu share one import package: remove the first
# before installing the second, never after, or the second loses its files.
RUN python3 -m pip install --no-cache-dir --requirement /wheels/serve.txt \
    && python3 -m pip uninstall --yes onnxruntime \
    && python3 -m pip install --no-cache-dir "onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}" \
    && rm -rf /wheels
COPY --chmod=755 docker/entrypoint.sh /usr/local/bin/bertserve-entrypoint
COPY --chmod=644 docker/healthcheck.py /usr/local/lib/bertserve/healthcheck.py
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/bertserve
VOLUME ["/cache"]
EXPOSE 8000
# The start period covers a first start that builds the TensorRT engine.
HEALTHCHECK --interval=30s --timeout=5s --start-period=1800s --retries=3 \
    CMD ["python3", "/usr/local/lib/bertserve/healthcheck.py"]
ENTRYPOINT ["/usr/local/bin/bertserve-entrypoint"]
CMD []
