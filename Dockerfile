# syntax=docker/dockerfile:1
# mtserve container images (multi-stage).
#
#   docker build -t mtserve:cpu  --target cpu  .       # ONNX Runtime on CPU (default target: the last one)
#   docker build -t mtserve:cuda --target cuda .       # onnxruntime-gpu on an NVIDIA CUDA/cuDNN base
#   docker run --rm -p 50051:50051 -p 9090:9090 mtserve:cpu
#
# Stages: `export` installs the export extra (CPU torch) and exports the shipped checkpoint
# (MODEL, models/de-en) to ONNX, fp32 + int8 + fp16, with the parity check against PyTorch;
# `runtime-venv` builds the serving virtualenv from the wheel (base dependencies only: no
# torch); `cpu` and `cuda` are the runtime images: no torch, no compilers, a non-root user, the
# gRPC and metrics ports, a gRPC health-protocol HEALTHCHECK, and `mtserve serve` as PID 1 so that
# SIGTERM drains (NOT_SERVING, finish in-flight work within MTSERVE_GRACE_PERIOD_S, exit 0).
#
# Build arguments:
#   BASE             Python base of the build stages and the CPU image. Must provide python3 with
#                    venv; a Debian bookworm rootfs made with debootstrap works too
#                    (scripts/container_base.sh; tests/deploy/test_container.py builds that way).
#   CUDA_BASE        base of the CUDA image: the CUDA runtime + cuDNN that the installed onnxruntime-gpu
#                    was built for (1.31: CUDA 13, cuDNN 9; it logs "Require cuDNN 9.* and CUDA 13.*" and
#                    falls back to CPU when they are missing).
#   MODEL            model dir inside the build context (model.safetensors, config.json, tokenizer.json).
#   MODEL_NAME       the model's name in the manifest (default de-en) unless its config.json names it.
#   TORCH_INDEX_URL  where the CPU build of torch comes from; empty: PyPI and the `wheels` context only.
# Build contexts (optional): `wheels` (e.g. `--build-context wheels=/opt/wheels`), local wheels
# pip may use (find-links), for offline or mirrored builds; `certs`, a directory whose
# ca-certificates.crt pip should trust (a TLS-intercepting proxy: `--build-context
# certs=/etc/ssl/certs`; only mounted while pip runs, never part of an image); `model`, a model
# dir to bake in instead of MODEL.

ARG BASE=python:3.11-slim
ARG CUDA_BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

FROM scratch AS wheels
FROM scratch AS certs

# The checkpoint to bake in: MODEL from the build context, or any model dir given as the `model`
# build context (`--build-context model=/path/to/model`).
FROM scratch AS model
ARG MODEL=models/de-en
COPY ${MODEL}/ /

# ---------------------------------------------------------------------------- export (torch)
FROM ${BASE} AS export
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python3 -m venv /opt/export
COPY pyproject.toml setup.py README.md ./
COPY protos/ protos/
COPY contract/ contract/
COPY export/ export/
COPY mtserve/ mtserve/
COPY service/ service/
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=bind,from=certs,target=/certs \
    if [ -f /certs/ca-certificates.crt ]; then export PIP_CERT=/certs/ca-certificates.crt; fi \
 && /opt/export/bin/pip install --find-links /wheels ${TORCH_INDEX_URL:+--extra-index-url ${TORCH_INDEX_URL}} \
        ".[export]"
# The manifest's model name is the model dir's name (as for `make serve`), unless config.json has one.
ARG MODEL_NAME=de-en
COPY --from=model / /src/${MODEL_NAME}/
RUN rm -rf /src/${MODEL_NAME}/onnx \
 && OMP_NUM_THREADS=2 /opt/export/bin/mtserve export --model /src/${MODEL_NAME} --out /out/onnx --precision all \
 && ls -l /out/onnx

# ---------------------------------------------------------------------------- serving virtualenv
FROM ${BASE} AS runtime-venv
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY protos/ protos/
COPY contract/ contract/
COPY export/ export/
COPY mtserve/ mtserve/
COPY service/ service/
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=bind,from=certs,target=/certs \
    if [ -f /certs/ca-certificates.crt ]; then export PIP_CERT=/certs/ca-certificates.crt; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --find-links /wheels --upgrade pip wheel \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /dist --find-links /wheels . \
 && /opt/venv/bin/pip install --find-links /wheels /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y pip wheel \
 && ! /opt/venv/bin/python -c "import torch" 2>/dev/null

# ---------------------------------------------------------------------------- CUDA runtime image
FROM ${CUDA_BASE} AS cuda
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=runtime-venv /dist/ /dist/
# The mtserve wheel pulls the CPU onnxruntime; onnxruntime-gpu replaces it (same module).
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=bind,from=certs,target=/certs \
    if [ -f /certs/ca-certificates.crt ]; then export PIP_CERT=/certs/ca-certificates.crt; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --find-links /wheels /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y onnxruntime \
 && /opt/venv/bin/pip install --find-links /wheels "onnxruntime-gpu>=1.20" \
 && /opt/venv/bin/pip uninstall -y pip \
 && rm -rf /dist \
 && ! /opt/venv/bin/python -c "import torch" 2>/dev/null
RUN groupadd --system --gid 10001 mtserve \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin mtserve
COPY --from=export --chown=root:root /out/onnx/ /models/de-en/onnx/
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    MTSERVE_MODEL_DIR=/models/de-en MTSERVE_ADDRESS=0.0.0.0:50051 MTSERVE_METRICS_PORT=9090 \
    MTSERVE_PROVIDER=cuda MTSERVE_PRECISION=fp16
USER 10001:10001
WORKDIR /home
EXPOSE 50051 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 CMD ["python3", "-m", "service.client.healthcheck"]
ENTRYPOINT ["mtserve", "serve"]

# ---------------------------------------------------------------------------- CPU runtime image
FROM ${BASE} AS cpu
RUN groupadd --system --gid 10001 mtserve \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin mtserve
COPY --from=runtime-venv /opt/venv/ /opt/venv/
COPY --from=export --chown=root:root /out/onnx/ /models/de-en/onnx/
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    MTSERVE_MODEL_DIR=/models/de-en MTSERVE_ADDRESS=0.0.0.0:50051 MTSERVE_METRICS_PORT=9090 \
    MTSERVE_PROVIDER=cpu MTSERVE_PRECISION=int8
USER 10001:10001
WORKDIR /home
EXPOSE 50051 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python3", "-m", "service.client.healthcheck"]
ENTRYPOINT ["mtserve", "serve"]
