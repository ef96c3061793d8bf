#!/usr/bin/env bash
# Run a pytest suite and make "no tests ran" (pytest exit 5) loud: it never passes silently.
#   scripts/test.sh            unit + integration (everything not marked slow), on two workers (tests/conftest.py)
#   scripts/test.sh slow       the slow suite
#   scripts/test.sh real       the real-model suite (make setup-real first)
set -uo pipefail
cd "$(dirname "$0")/.."
suite=${1:-default}
shift || true
case "$suite" in
    # the default run ends with its 25 slowest steps (docs/testing.md). Two workers: the tests on Ray clusters on
    # one, in order, everything else on the other (`worker_group` in tests/conftest.py)
    default) marker="not slow and not real"; extra=(-n 2 --dist loadgroup --cov --cov-report=term --durations=25) ;;
    slow) marker="slow and not real"; extra=() ;;
    # a model that runs one request at a time: the suite's own timeouts, not the default 300 s per test
    real) marker="real"; extra=(--durations=25 --timeout=1800 -p no:cacheprovider tests/real) ;;
    *) echo "unknown suite '$suite' (use: default, slow, real)" >&2; exit 2 ;;
esac

.venv/bin/python -m pytest -m "$marker" "${extra[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "ERROR: pytest collected no tests for the '$suite' suite (-m \"$marker\"); nothing was tested." >&2
    exit 1
fi
exit "$rc"
