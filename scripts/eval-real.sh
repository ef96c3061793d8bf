#!/usr/bin/env bash
# `make eval-real`: the published real-model study (docs/evaluation.md, "The real-model study") from a clean
# checkout. Starts `reasonray serve --llm local` (SmolLM2-135M-Instruct on llama.cpp's server, response cache off,
# its own data directory under OUT), runs every part of reasonray/evals/study/real.toml through it over HTTP,
# stops the service, and leaves in OUT a folder per part (results.jsonl, report.md/json, plots, run.json) and
# OUT/SUMMARY.md. A rerun resumes what is not done and regenerates every table and plot.
#
#   scripts/eval-real.sh                        # every part, into runs/eval-real
#   OUT=/tmp/study scripts/eval-real.sh --part pilot --part memory
#   URL=http://127.0.0.1:18765 scripts/eval-real.sh   # a service already running: use it, start nothing
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-runs/eval-real}"
PORT="${PORT:-18765}"
mkdir -p "$OUT/service-data"
started=$(date +%s)

SERVICE_PID=""
stop_service() {
    if [[ -n "$SERVICE_PID" ]] && kill -0 "$SERVICE_PID" 2>/dev/null; then
        kill -INT -- "-$SERVICE_PID" 2>/dev/null || true  # the service's own process group: Ray and llama.cpp with it
        for _ in $(seq 120); do kill -0 "$SERVICE_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$SERVICE_PID" 2>/dev/null || true
    fi
}
trap stop_service EXIT

if [[ -z "${URL:-}" ]]; then
    URL="http://127.0.0.1:$PORT"
    # cache off: every strategy pays for its own calls; a long request timeout: a one-slot server queues calls
    REASONRAY_LLM__CACHE__ENABLED=false REASONRAY_LLM__REQUEST_TIMEOUT_S=300 REASONRAY_DATA_DIR="$OUT/service-data" \
        setsid .venv/bin/reasonray serve --llm local --port "$PORT" --num-cpus 2 --no-dashboard \
        >"$OUT/service-data/serve.log" 2>&1 &
    SERVICE_PID=$!
    for _ in $(seq 600); do
        if curl -fsS "$URL/healthz" >/dev/null 2>&1; then break; fi
        if ! kill -0 "$SERVICE_PID" 2>/dev/null; then tail -50 "$OUT/service-data/serve.log" >&2; exit 1; fi
        sleep 1
    done
    curl -fsS "$URL/healthz" >/dev/null || { echo "reasonray serve did not come up in 600 s" >&2; exit 1; }
fi

status=0
.venv/bin/python -m reasonray.evals.study --url "$URL" --out "$OUT" "$@" || status=$?
echo "make eval-real: wall time $(( ($(date +%s) - started) / 60 )) min; results in $OUT (SUMMARY.md)"
exit $status
