# syntax=docker/dockerfile:1
# mtserve container images (multi-stage).
#
#   docker build -t mtserve:cpu  --target cpu  .       # ONNX Runtime on CPU (default target: the last one)
#   docker build -t mtserve:cuda --target cuda .       # onnxruntime-gpu on an NVIDIA CUDA/cuDNN base
#   docker run --rm -p 50051:50051 -p 9090:9090 mtserve:cpu
#
# Stages: `export` installs the export extra (CPU torch) and exports every checkpoint of the model
# repository (MODELS, models/: each NAME/VERSION/, e.g. de-en/1) to ONNX, fp32 + int8 + fp16, with
# the parity check against PyTorch;
# `runtime-venv` builds the serving virtualenv from the wheel (base dependencies only: no
# torch); `cpu` and `cuda` are the runtime images: no torch, no compilers, a non-root user, the
# gRPC and metrics ports, a gRPC health-protocol HEALTHCHECK, and `mtserve serve` as PID 1 so that
# SIGTERM drains (NOT_SERVING, finish in-flight work within MTSERVE_GRACE_PERIOD_S, exit 0). The
# runtime images hold the exported graphs as a model repository in Triton's layout,
# /models/NAME/VERSION/onnx/, and serve all of it (MTSERVE_MODEL_REPOSITORY=/models: the latest
# version of every model; MTSERVE_MODELS picks, MTSERVE_DEFAULT_MODEL names the default, else the
# first by name). Mounting another repository over /models, or pointing MTSERVE_MODEL_REPOSITORY
# elsewhere (KServe: /mnt/models), serves that instead.
#
# Build arguments:
#   BASE             Python base of the build stages and the CPU image. Must provide python3 with
#                    venv; a Debian bookworm rootfs made with debootstrap works too
#                    (scripts/container_base.sh; tests/deploy/test_container.py builds that way).
#   CUDA_BASE        base of the CUDA image: the CUDA runtime + cuDNN that the installed onnxruntime-gpu
#                    was built for (1.31: CUDA 13, cuDNN 9; it logs "Require cuDNN 9.* and CUDA 13.*" and
#                    falls back to CPU when they are missing).
#   MODELS           model repository inside the build context (default models): NAME/VERSION/ dirs with
#                    model.safetensors, config.json, tokenizer.json; every one is exported and baked in,
#                    its manifest named NAME (the name it is served under).
#   TORCH_INDEX_URL  where the CPU build of torch comes from; empty: PyPI and the `wheels` context only.
# Build contexts (optional): `wheels` (e.g. `--build-context wheels=/opt/wheels`), local wheels
# pip may use (find-links), for offline or mirrored builds; `certs`, a directory whose
# ca-certificates.crt pip should trust (a TLS-intercepting proxy: `--build-context
# certs=/etc/ssl/certs`; only mounted while pip runs, never part of an image); `models`, a model
# repository (NAME/VERSION/ dirs) to bake in instead of MODELS.

ARG BASE=python:3.11-slim
ARG CUDA_BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

FROM scratch AS wheels
FROM scratch AS certs

# The checkpoints to bake in: the model repository MODELS from the build context, or any
# repository given as the `models` build context (`--build-context models=/path/to/repository`).
FROM scratch AS models
ARG MODELS=models
COPY ${MODELS}/ /

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
# Every version dir of the repository (as `make serve` does), exported to /out/NAME/VERSION/onnx
# with the manifest named NAME; graphs the build context may hold are not used. No version dir, or
# one that does not export: the build fails.
COPY --from=models / /src/models/
RUN set -e; n=0; \
    for v in /src/models/*/[0-9]*; do \
      [ -d "$v" ] || continue; \
      name=$(basename "$(dirname "$v")"); version=$(basename "$v"); \
      case "$version" in *[!0-9]*) continue;; esac; [ "$version" -gt 0 ] || continue; \
      rm -rf "$v/onnx"; \
      echo "exporting $name version $version"; \
      OMP_NUM_THREADS=2 /opt/export/bin/mtserve export --model "$v" --name "$name" \
          --out "/out/$name/$version/onnx" --precision all; \
      n=$((n + 1)); \
    done; \
    if [ "$n" -eq 0 ]; then echo "no NAME/VERSION/ model dir in the models context" >&2; exit 1; fi; \
    ls -lR /out

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
COPY --from=export --chown=root:root /out/ /models/
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    MTSERVE_MODEL_REPOSITORY=/models MTSERVE_ADDRESS=0.0.0.0:50051 MTSERVE_METRICS_PORT=9090 \
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
COPY --from=export --chown=root:root /out/ /models/
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    MTSERVE_MODEL_REPOSITORY=/models MTSERVE_ADDRESS=0.0.0.0:50051 MTSERVE_METRICS_PORT=9090 \
    MTSERVE_PROVIDER=cpu MTSERVE_PRECISION=int8
USER 10001:10001
WORKDIR /home
EXPOSE 50051 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python3", "-m", "service.client.healthcheck"]
ENTRYPOINT ["mtserve", "serve"]
