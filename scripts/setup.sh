#!/usr/bin/env bash
# Create .venv and install ReasonRay with its test tools and the example third-party strategy
# (examples/reasonray-step-back). Idempotent: it reinstalls only when a pyproject.toml changed since
# the last successful install.
#   scripts/setup.sh           what the default suite needs (`make test`, `make serve`)
#   scripts/setup.sh --slow    also what only the slow suite uses: buildah and debootstrap (`make test-slow`)
set -euo pipefail
cd "$(dirname "$0")/.."
slow=false
case "${1:-}" in
    "") ;;
    --slow) slow=true ;;
    *) echo "unknown option '$1' (use: --slow)" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "ReasonRay needs Python >= 3.11; $("$PYTHON" --version 2>&1) found. Set PYTHON=/path/to/python3.11." >&2
    exit 1
fi

# Debian packages, installed only when missing, in one apt-get run:
# - PostgreSQL 15: the cluster store's tests, benchmark and multi-node test start throw-away servers from
#   /usr/lib/postgresql/15/bin ([store] url, docs/deploy.md);
# - bubblewrap: the python tool's sandbox (reasonray/kernel/sandbox.py; prlimit and setpriv come with
#   util-linux). Without it the tool refuses to run code rather than run it unisolated;
# - buildah and debootstrap (--slow only): the slow suite builds the container image without a Docker
#   engine (deploy/build-image.sh), on a Debian base that debootstrap makes.
missing=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if $slow; then
    command -v buildah >/dev/null 2>&1 || missing+=(buildah)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get install -y -q "${missing[@]}" || { apt-get update -q && apt-get install -y -q "${missing[@]}"; }) >/dev/null
    else
        echo "note: ${missing[*]} missing (sudo apt-get install ${missing[*]}): without PostgreSQL its store tests are skipped," \
            "without bubblewrap the python tool is refused, without buildah/debootstrap the image build test is skipped" >&2
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
# One install run (one resolution). torch is pinned in it: the CPU build of this version lies on disk here
# (2.13.0+cpu, which pip prefers to 2.13.0); any other torch requirement (sentence-transformers asks for
# one) would make pip fetch a multi-gigabyte CUDA build. --no-compile: Python compiles what is imported
# when it is first imported, instead of pip compiling every module of torch, ray and the rest up front.
packages=(torch==2.13.0 -e '.[dev]' -e examples/reasonray-step-back)
# uv (https://docs.astral.sh/uv/) installs the same versions as pip in a tenth of the time (12 s against about
# two minutes here, with nothing cached). It does not read pip's configuration, so the find-links, extra indexes
# and constraints pip is configured with on this machine (the local CPU build of torch among them) are passed on.
# Where uv cannot be had, pip does it.
uv_options() {
    .venv/bin/python -m pip config list 2>/dev/null | sed -nE "s/^[^.]*\.(find-links|extra-index-url|index-url|constraint)='(.*)'$/\1 \2/p" |
        while read -r key values; do
            for value in $values; do printf -- '--%s\n%s\n' "$key" "$value"; done
        done
}
if .venv/bin/python -m pip install --quiet uv 2>>.venv/pip.log && [ -x .venv/bin/uv ]; then
    mapfile -t options < <(uv_options)
    # unsafe-best-match: the best version across every index, as pip chooses (uv would take the first index having it)
    quiet .venv/bin/uv pip install --quiet --python .venv/bin/python --index-strategy unsafe-best-match "${options[@]}" "${packages[@]}"
else
    quiet .venv/bin/python -m pip install --quiet --no-compile "${packages[@]}"
fi
compose_schema || echo "note: the Compose schema could not be fetched (.venv/pip.log); tests/unit/test_deploy.py will say so" >&2
echo "$want" > "$stamp"
echo "ReasonRay installed in .venv"
