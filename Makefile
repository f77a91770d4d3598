# Two commands for a fresh machine:
#   make demo   compile a real model (GPT-2) with novaforge, compare with eager, print the report and
#               write it as HTML (novaforge-report-<model>.html; the path is printed)
#   make test   run the test suite
# Both create .venv with torch==2.13.0 (CPU wheel) and what they need.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/novaforge cache install-gemm || echo "nf_gemm: not built now; the first compile builds it"
	touch $(STAMP)

# nf_gemm's install-time build again when its sources change (a stale one is rebuilt in every new
# cache folder: ~12 s in each test that uses its own)
GEMM_SRC := $(wildcard src/novaforge/codegen/cpu/gemm/*.cpp src/novaforge/codegen/cpu/gemm/*.h)
GEMM_STAMP := $(VENV)/.gemm-installed

$(GEMM_STAMP): $(STAMP) $(GEMM_SRC)
	$(BIN)/novaforge cache install-gemm || echo "nf_gemm: not built now; the first compile builds it"
	touch $@

.PHONY: venv demo test lint bench
venv: $(STAMP) $(GEMM_STAMP)

demo: $(STAMP)
	$(BIN)/novaforge demo $(ARGS)

test: $(STAMP) $(GEMM_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

bench: $(STAMP)
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/novaforge bench --workload gpt2 --runner all $(ARGS)
