# bertserve server images (docker/README.md). Two targets:
#   cpu  python:3.11-slim + bertserve[serve] (onnxruntime on CPU, no torch) + the demo model as ONNX:
#        docker build --target cpu -t bertserve:cpu .
#        docker run --rm -p 8000:8000 --stop-timeout 45 bertserve:cpu        # serves the demo model
#   gpu  NVIDIA's TensorRT image + bertserve[serve] with onnxruntime-gpu; with
#        BERTSERVE_BACKEND=tensorrt the entrypoint builds the engine for the GPU it runs on:
#        docker build --target gpu -t bertserve:gpu .
# Your own model: mount an artifact (or checkpoint) directory and name it in BERTSERVE_MODEL, e.g.
#   docker run -p 8000:8000 -v "$PWD/artifacts/sst2:/models/sst2:ro" -e BERTSERVE_MODEL=/models/sst2 bertserve:cpu
#
# No `# syntax=` line: it makes BuildKit fetch its Dockerfile frontend from a registry, which a mirrored or
# air-gapped build cannot reach. Nothing here needs more than the frontend built into Docker 20.10, and the
# file builds the same with the legacy builder (DOCKER_BUILDKIT=0): no COPY --chmod, no RUN --mount.
#
# Build arguments (all optional; the defaults work on a machine that reaches the public registries):
#   PYTHON_IMAGE, TENSORRT_IMAGE   base images, e.g. from a mirror: registry.example.com/library/python:3.11-slim-bookworm
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST   a package index mirror (read by pip as they are)
#   TORCH_PIP_ARGS                 where the demo stage gets torch (see the demo stage)
#   DEMO_EXPORT_ARGS               the precision the demo model is exported at (see the demo stage)
# Dependencies are pinned by docker/constraints.txt (regenerate with docker/lock-constraints.sh).
#
# Keep TENSORRT_IMAGE and ONNXRUNTIME_GPU_VERSION in step: onnxruntime-gpu 1.22 is built against
# TensorRT 10.9 and CUDA 12.x, which the 25.03 TensorRT container ships.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG TENSORRT_IMAGE=nvcr.io/nvidia/tensorrt:25.03-py3

# ---- wheel: bertserve built once, so the runtime stages carry neither the source tree nor build tools
FROM ${PYTHON_IMAGE} AS wheel
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
# As an environment variable the constraints also pin the build backend pip installs for `pip wheel`.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CONSTRAINT=/src/docker/constraints.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY docker/constraints.txt docker/requirements.py docker/
COPY bert/ bert/
COPY training/ training/
COPY export/ export/
COPY runtime/ runtime/
COPY serving/ serving/
# /wheels: serve.txt and export.txt name the wheel with an extra, for `pip install -r` below.
# /deps: the constraints and the third-party requirements of each extra. The stages below install
# /deps first: its content changes only with pyproject.toml, so after a code change the dependency
# layers stay cached and only the wheel is reinstalled.
# serving/demo_model/ (a checkpoint, not a package) is not part of the wheel.
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && printf 'bertserve[serve] @ file://%s\n' /wheels/bertserve-*.whl > /wheels/serve.txt \
    && printf 'bertserve[export] @ file://%s\n' /wheels/bertserve-*.whl > /wheels/export.txt \
    && mkdir /deps \
    && cp docker/constraints.txt /deps/constraints.txt \
    && python3 docker/requirements.py serve otlp > /deps/serve.txt \
    && python3 docker/requirements.py export > /deps/export.txt

# ---- demo: the built-in demo checkpoint exported to ONNX, so the torch-free cpu image can serve it.
# Exporting needs torch, so it happens here and only the artifact moves on. torch is the CPU build from
# PyTorch's CPU index (an unpinned torch from PyPI pulls GBs of CUDA libraries); the index holds torch's
# dependencies too. Elsewhere, name an index or a directory that has it, e.g.
#   --build-arg TORCH_PIP_ARGS="--index-url https://mirror.example.com/pytorch-cpu/simple"
#   --network host --build-arg TORCH_PIP_ARGS="--find-links http://127.0.0.1:8765/"   (a local wheel served over HTTP)
# The alternative, a pre-exported artifact in the repository, would add 23-91 MB of generated files to git
# for every retraining of the demo model; the export takes about 40 s here and is cached with the stage.
FROM ${PYTHON_IMAGE} AS demo
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# See docker/README.md ("Demo model") for the agreement of each precision with the torch fp32 model on
# held-out data (docker/demo_agreement.py).
ARG DEMO_EXPORT_ARGS="--precision fp32"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY --from=wheel /deps /deps
# torch first, from TORCH_PIP_ARGS: installed, it satisfies [export]'s torch requirement.
RUN pip install --constraint /deps/constraints.txt ${TORCH_PIP_ARGS} torch \
    && pip install --constraint /deps/constraints.txt --requirement /deps/export.txt
COPY --from=wheel /wheels /wheels
RUN pip install --constraint /deps/constraints.txt --requirement /wheels/export.txt
COPY serving/demo_model/ /src/demo_model/
# The export verifies itself against torch and exits 1 (failing the build) when out of tolerance.
# model.portable.onnx (TensorRT's input) is not needed by onnxruntime on CPU.
RUN python -m export.onnx --ckpt /src/demo_model ${DEMO_EXPORT_ARGS} --out /demo \
    && rm /demo/model.portable.onnx

# ---- cpu: ONNX Runtime on CPU
FROM ${PYTHON_IMAGE} AS cpu
LABEL org.opencontainers.image.title="bertserve" \
      org.opencontainers.image.description="Batched BERT inference server (classify, NER, QA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    BERTSERVE_HOST=0.0.0.0 \
    BERTSERVE_PORT=8000 \
    BERTSERVE_ENGINE_CACHE=/cache
# One id for user and group, so USER 10001:10001 names a group that exists and files it writes are 10001:10001.
RUN groupadd --system --gid 10001 bertserve \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/bertserve \
       --shell /usr/sbin/nologin bertserve \
    && mkdir -p /cache \
    && chown 10001:10001 /cache
# The [serve] extra brings onnxruntime and no torch, [otlp] --otlp-endpoint's tracing; every version pinned by the
# constraints.
COPY --from=wheel /deps /deps
RUN pip install --constraint /deps/constraints.txt --requirement /deps/serve.txt
COPY --from=wheel /wheels /wheels
RUN pip install --constraint /deps/constraints.txt --requirement /wheels/serve.txt \
    && rm -rf /wheels /deps
# The demo model as the package's serving/demo_model, where `python -m serving` with no model looks.
COPY --from=demo /demo /opt/bertserve/demo_model
RUN ln -s /opt/bertserve/demo_model "$(python3 -c 'import pathlib, serving; print(pathlib.Path(serving.__file__).parent)')/demo_model"
# Modes come from the repository (entrypoint.sh 755, healthcheck.py 644); COPY keeps them with either builder.
COPY docker/entrypoint.sh /usr/local/bin/bertserve-entrypoint
COPY docker/healthcheck.py /usr/local/lib/bertserve/healthcheck.py
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/bertserve
VOLUME ["/cache"]
EXPOSE 8000
# The server drains on SIGTERM: /ready says 503 while it still serves for --drain-delay-s (5 s), then new
# requests get 503, admitted ones finish within --shutdown-timeout-s (30 s) and the process exits about 2 s
# later. Docker's default stop timeout (10 s) is shorter than that worst stop of 37 s: run with
# --stop-timeout 45 (compose: stop_grace_period 50s).
STOPSIGNAL SIGTERM
# Healthy = /ready answers 200, on whatever port the server listens (healthcheck.py reads it from /proc).
# Every 5 s, so "healthy" follows readiness within 5 s: Docker 20.10 has no --start-interval (Docker 25+)
# and rejects the flag, so the interval itself is short; one check costs ~20 ms of CPU.
HEALTHCHECK --interval=5s --timeout=4s --start-period=120s --retries=3 \
    CMD ["python3", "-I", "/usr/local/lib/bertserve/healthcheck.py"]
ENTRYPOINT ["/usr/local/bin/bertserve-entrypoint"]
CMD []

# ---- gpu: TensorRT + ONNX Runtime on CUDA (holds no model: name one in BERTSERVE_MODEL)
FROM ${TENSORRT_IMAGE} AS gpu
LABEL org.opencontainers.image.title="bertserve" \
      org.opencontainers.image.description="Batched BERT inference server (classify, NER, QA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG ONNXRUNTIME_GPU_VERSION=1.22.0
# The base image's Python is the system one (Ubuntu 24.04, PEP 668): pip may install into it here.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    BERTSERVE_DEVICE=cuda \
    BERTSERVE_HOST=0.0.0.0 \
    BERTSERVE_PORT=8000 \
    BERTSERVE_ENGINE_CACHE=/cache
RUN groupadd --system --gid 10001 bertserve \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/bertserve \
       --shell /usr/sbin/nologin bertserve \
    && mkdir -p /cache \
    && chown 10001:10001 /cache
COPY --from=wheel /deps /deps
COPY --from=wheel /wheels /wheels
# onnxruntime (CPU, from [serve]) and onnxruntime-gpu share one import package: remove the first
# before installing the second, never after, or the second loses its files.
RUN python3 -m pip install --constraint /deps/constraints.txt --requirement /wheels/serve.txt \
    && python3 -m pip uninstall --yes onnxruntime \
    && python3 -m pip install "onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}" \
    && rm -rf /wheels /deps
COPY docker/entrypoint.sh /usr/local/bin/bertserve-entrypoint
COPY docker/healthcheck.py /usr/local/lib/bertserve/healthcheck.py
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/bertserve
VOLUME ["/cache"]
EXPOSE 8000
STOPSIGNAL SIGTERM
# The start period covers a first start that builds the TensorRT engine.
HEALTHCHECK --interval=10s --timeout=4s --start-period=1800s --retries=3 \
    CMD ["python3", "-I", "/usr/local/lib/bertserve/healthcheck.py"]
ENTRYPOINT ["/usr/local/bin/bertserve-entrypoint"]
CMD []
