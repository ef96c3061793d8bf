#!/usr/bin/env bash
# Create .venv and install ReasonRay with its test tools. Idempotent: it reinstalls only when
# pyproject.toml changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "ReasonRay needs Python >= 3.11; $("$PYTHON" --version 2>&1) found. Set PYTHON=/path/to/python3.11." >&2
    exit 1
fi

stamp=.venv/.installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# The registry mirrors configured on some machines print one warning per package; keep real errors.
quiet() { "$@" 2> >(grep -v -e 'is ignored: it is neither' -e BuildBackendWarning >&2); }
quiet .venv/bin/python -m pip install --quiet --upgrade pip
quiet .venv/bin/python -m pip install --quiet -e '.[dev]'
echo "$want" > "$stamp"
echo "ReasonRay installed in .venv"
