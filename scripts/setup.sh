#!/usr/bin/env bash
# Create .venv and install ReasonRay with its test tools and the example third-party strategy
# (examples/reasonray-step-back). Idempotent: it reinstalls only when a pyproject.toml changed since
# the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "ReasonRay needs Python >= 3.11; $("$PYTHON" --version 2>&1) found. Set PYTHON=/path/to/python3.11." >&2
    exit 1
fi

# PostgreSQL 15 (Debian's): the cluster store's tests, benchmark and multi-node test start throw-away
# servers from /usr/lib/postgresql/15/bin ([store] url, docs/deploy.md). Installed only when missing.
if [ ! -x /usr/lib/postgresql/15/bin/postgres ] && command -v apt-get >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        (apt-get install -y -q postgresql || { apt-get update -q && apt-get install -y -q postgresql; }) >/dev/null
    else
        echo "note: PostgreSQL is not installed; the PostgreSQL store tests will be skipped (sudo apt-get install postgresql)" >&2
    fi
fi
# The python tool's sandbox (reasonray/kernel/sandbox.py) needs bubblewrap; prlimit and setpriv come
# with util-linux. Without them the tool refuses to run code rather than run it unisolated.
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y bubblewrap >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y bubblewrap >/dev/null; }
    else
        echo "warning: bubblewrap (bwrap) is missing: install it (apt-get install bubblewrap) or the python tool is refused" >&2
    fi
fi
# The slow suite builds the container image without a Docker engine (deploy/build-image.sh): buildah, on a
# Debian base that debootstrap makes. Installed only when missing.
if ! command -v buildah >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get install -y -q buildah debootstrap || { apt-get update -q && apt-get install -y -q buildah debootstrap; }) >/dev/null
    else
        echo "note: buildah or debootstrap is missing; the slow suite's image build will be skipped (sudo apt-get install buildah debootstrap)" >&2
    fi
fi

# The /metrics tests check the page with promtool (Debian's prometheus package), as an operator's lint would.
if ! command -v promtool >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get install -y -q prometheus || { apt-get update -q && apt-get install -y -q prometheus; }) >/dev/null
    else
        echo "note: promtool is missing; the /metrics lint test will fail (sudo apt-get install prometheus)" >&2
    fi
fi

# The official Compose Specification schema, for tests/unit/test_deploy.py: the docker-compose 1.29.2 wheel
# carries it (compose/config/compose_spec.json). Fetched once at setup (tests never reach a registry); the
# package's pins conflict with this project's, so it is unpacked, not installed.
compose_schema() {
    [ -f .venv/share/compose_spec.json ] && return 0
    local into
    into=$(mktemp -d)
    .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: -d "$into" docker-compose==1.29.2 2>>.venv/pip.log \
        && mkdir -p .venv/share \
        && .venv/bin/python -c 'import sys, zipfile, glob; sys.stdout.buffer.write(zipfile.ZipFile(glob.glob(sys.argv[1] + "/docker_compose-*.whl")[0]).read("compose/config/compose_spec.json"))' "$into" > .venv/share/compose_spec.json.tmp \
        && mv .venv/share/compose_spec.json.tmp .venv/share/compose_spec.json
    rm -rf "$into"
}

stamp=.venv/.installed
want=$(cat pyproject.toml examples/*/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    compose_schema || echo "note: the Compose schema could not be fetched (.venv/pip.log); tests/unit/test_deploy.py will say so" >&2
    exit 0
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# pip and setuptools print warnings by the screenful (registry mirrors, editable installs): keep them
# in .venv/pip.log and show them only when the install fails.
quiet() {
    if ! "$@" 2>>.venv/pip.log; then
        cat .venv/pip.log >&2
        echo "setup failed: '$*' (log above, also in .venv/pip.log)" >&2
        return 1
    fi
}
quiet .venv/bin/python -m pip install --quiet --upgrade pip
# torch first, pinned: the CPU build of this version lies on disk here; any other torch requirement
# (sentence-transformers asks for one) would make pip fetch a multi-gigabyte CUDA build.
quiet .venv/bin/python -m pip install --quiet torch==2.13.0
quiet .venv/bin/python -m pip install --quiet -e '.[dev]' -e examples/reasonray-step-back
compose_schema || echo "note: the Compose schema could not be fetched (.venv/pip.log); tests/unit/test_deploy.py will say so" >&2
echo "$want" > "$stamp"
echo "ReasonRay installed in .venv"
