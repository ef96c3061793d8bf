# The two commands of the README: `make serve` and `make test`. Both set everything up first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Offline BPE files for tiktoken, when this checkout sits beside the shared folder.
ifneq ($(wildcard ../shared/tiktoken),)
export TIKTOKEN_CACHE_DIR ?= $(abspath ../shared/tiktoken)
endif
export RAY_AUTH_MODE ?= token

.PHONY: help setup setup-slow lint serve test test-slow bench bench-peers eval setup-real test-real bench-real eval-real

help:
	@echo "make serve      set up .venv and run the Serve API on a local Ray cluster"
	@echo "make test       set up .venv, then the test suite (unit + integration, the lint checks among the unit tests)"
	@echo "make lint       ruff (lint and format) and the import-layer contracts"
	@echo "make test-slow  the slow suite"
	@echo "make bench      the benchmarks under bench/"
	@echo "make bench-peers [ARGS=--quick]   ReasonRay side by side with optillm and DSPy (installed in .venv-peers)"
	@echo "make setup-real the real model: llama.cpp's server and SmolLM2-135M (builds llama.cpp once, ~10 min)"
	@echo "make test-real  the real-model suite against SmolLM2-135M on llama.cpp (about 7 minutes)"
	@echo "make bench-real ReasonRay against direct calls to the same llama.cpp server"
	@echo "make eval ARGS=\"--dataset F --strategies A,B --out DIR\"   a batch evaluation (docs/evaluation.md)"
	@echo "make eval-real  the published real-model study, every table and plot (parts of under an hour; OUT=runs/eval-real)"

setup:
	@scripts/setup.sh

# the slow suite also needs buildah and debootstrap (its container image build); the default run does not
setup-slow:
	@scripts/setup.sh --slow

serve: setup
	.venv/bin/reasonray serve $(ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy --strict -p reasonray.kernel -p reasonray.gateway -p reasonray.api

# the lint checks run inside the suite (tests/unit/test_lint.py, test_layers.py), beside the integration tests
test: setup
	scripts/test.sh default $(ARGS)

test-slow: setup-slow
	scripts/test.sh slow $(ARGS)

bench: setup
	.venv/bin/python bench/overhead.py
	.venv/bin/python bench/bounded_context.py
	.venv/bin/python bench/strategies.py
	.venv/bin/python bench/memory.py
	.venv/bin/python bench/matts.py
	.venv/bin/python bench/evals.py
	.venv/bin/python bench/metrics.py
	.venv/bin/python bench/openai_endpoint.py

# The peers of bench/peers.py live in a virtual environment of their own, never in .venv. optillm goes
# in with --no-deps (bench/peers/requirements.txt says why; the packages its proxy imports are listed
# there). Reinstalled only when bench/peers/requirements.txt changes.
.venv-peers/.installed: bench/peers/requirements.txt
	[ -x .venv-peers/bin/python ] || $${PYTHON:-python3} -m venv .venv-peers
	.venv-peers/bin/python -m pip install --quiet -r <(grep -v '^optillm==' bench/peers/requirements.txt)
	.venv-peers/bin/python -m pip install --quiet --no-deps $$(grep '^optillm==' bench/peers/requirements.txt)
	touch $@

bench-peers: setup .venv-peers/.installed
	.venv/bin/python bench/peers.py $(ARGS)

eval: setup
	.venv/bin/python -m reasonray.evals.run $(ARGS)

# The real model (docs/real-model.md): llama.cpp's OpenAI-compatible server and SmolLM2-135M-Instruct.
setup-real: setup
	@scripts/setup-real.sh

test-real: setup-real
	scripts/test.sh real $(ARGS)

bench-real: setup-real
	.venv/bin/python bench/real_model.py $(ARGS)

eval-real: setup-real
	scripts/eval-real.sh $(ARGS)
