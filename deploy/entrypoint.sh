#!/bin/sh
# The container's entrypoint (Dockerfile, deploy/compose.yaml): check the environment, then run ReasonRay.
#   serve  (default)  a Ray head node with the Serve API: `reasonray serve` on the container's own cluster
#   worker            a Ray worker node joining RAY_HEAD_ADDRESS (ray start --block)
#   anything else     run as given (a shell, `reasonray ask`, ...)
# A missing or malformed variable stops the container at once with exit code 64, naming the variable and
# how to set it, before anything starts. SIGTERM (docker stop, Kubernetes) reaches `reasonray serve`
# directly (exec): it stops taking requests, lets in-flight runs finish and save their sessions, then exits.
set -eu

fail() {
    echo "reasonray-entrypoint: $*" >&2
    exit 64
}

require() {  # require NAME "what it is and an example"
    eval "value=\${$1:-}"
    [ -n "$value" ] || fail "$1 is not set: $2"
}

check_serve() {
    require REASONRAY_DATA_DIR "the directory for event logs and traces (a volume), e.g. /data"
    require REASONRAY_STORE__URL "the PostgreSQL store every node shares, e.g. postgresql://reasonray@postgres:5432/reasonray (docs/deploy.md)"
    case "$REASONRAY_STORE__URL" in
        postgresql://* | postgres://*) ;;
        *) fail "REASONRAY_STORE__URL must be a postgresql:// URL (got '$REASONRAY_STORE__URL')" ;;
    esac
    if [ "${REASONRAY_MEMORY__ENABLED:-true}" != "false" ]; then
        require REASONRAY_MEMORY__CHROMA_URL "the Chroma server, e.g. http://chroma:8000 (or REASONRAY_MEMORY__ENABLED=false)"
    fi
    port=${REASONRAY_SERVER__PORT:-8000}
    case "$port" in
        '' | *[!0-9]*) fail "REASONRAY_SERVER__PORT must be a port number (got '$port')" ;;
    esac
    if [ "${REASONRAY_LLM__PROVIDER:-auto}" != "simulated" ] && [ -z "${OPENAI_API_KEY:-}" ] && [ -z "${OPENAI_BASE_URL:-}" ]; then
        fail "OPENAI_API_KEY is not set: the model's API key (or OPENAI_BASE_URL for a keyless endpoint, or REASONRAY_LLM__PROVIDER=simulated for the simulated model)"
    fi
    [ -d "$REASONRAY_DATA_DIR" ] && [ -w "$REASONRAY_DATA_DIR" ] || fail "REASONRAY_DATA_DIR=$REASONRAY_DATA_DIR is not a writable directory"
}

command=${1:-serve}
[ $# -gt 0 ] && shift
case "$command" in
    serve)
        check_serve
        exec reasonray serve --host "${REASONRAY_SERVER__HOST:-0.0.0.0}" --port "$port" "$@"
        ;;
    worker)
        require RAY_HEAD_ADDRESS "the head node's GCS address, e.g. head:6379"
        exec ray start --address "$RAY_HEAD_ADDRESS" --block "$@"
        ;;
    *)
        exec "$command" "$@"
        ;;
esac
