# ReasonRay: the Serve API on a Ray head node (or a worker node: override the command with `ray start`).
# Build:  docker build -t reasonray .        Run: docker compose -f deploy/compose.yaml up (docs/deploy.md)
# Without Docker or an image registry: deploy/build-image.sh (buildah, on a Debian base made by debootstrap).
# BASE_IMAGE: any Debian bookworm image with python3.11 and its venv module.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_AUTH_MODE=token \
    REASONRAY_DATA_DIR=/data \
    REASONRAY_SERVER__HOST=0.0.0.0 \
    REASONRAY_SERVER__PORT=8000 \
    PATH=/opt/venv/bin:$PATH

# curl for the health check; tini reaps Ray's child processes and forwards SIGTERM to the entrypoint
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# A virtual environment, so the same steps work on a Debian base, whose system Python refuses pip (PEP 668)
RUN python3 -m venv /opt/venv
# torch pinned and installed first, as scripts/setup.sh does: any other torch requirement
# (sentence-transformers asks for one) would pull a multi-gigabyte CUDA build, which is what PyPI serves
# for Linux; PyTorch's CPU index serves 2.13.0+cpu. WHEELS_DIR: a directory of wheels lent to the build
# (deploy/build-image.sh mounts one), searched as well as the index.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG WHEELS_DIR
RUN pip install torch==2.13.0 --index-url "${TORCH_INDEX_URL}" ${WHEELS_DIR:+--find-links "$WHEELS_DIR"}
COPY pyproject.toml README.md ./
COPY reasonray ./reasonray
COPY actors ./actors
COPY strategies ./strategies
COPY memory ./memory
COPY serve_app.py config.toml ./
COPY deploy/entrypoint.sh /usr/local/bin/reasonray-entrypoint
RUN pip install ${WHEELS_DIR:+--find-links "$WHEELS_DIR"} . && chmod 0755 /usr/local/bin/reasonray-entrypoint

# a non-root user owns the data directory (event logs and traces, embedded Chroma when no server is set)
RUN useradd --create-home --uid 10001 reasonray && mkdir -p /data && chown reasonray /data
USER reasonray
VOLUME ["/data"]
EXPOSE 8000 8265 6379

HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${REASONRAY_SERVER__PORT}/healthz" || exit 1

ENTRYPOINT ["tini", "--", "reasonray-entrypoint"]
CMD ["serve"]
