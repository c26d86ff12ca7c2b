# The two set-up commands: `make demo` and `make test`. Each creates .venv when missing and builds the kernels.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-torch lint bench kernels clean

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,distributed]'
	touch $(STAMP)

kernels: $(STAMP)
	$(BIN)/python -m udf_kernels.build

demo: kernels
	$(BIN)/python -m tensorsql.demo

test: kernels
	$(BIN)/python -m pytest

# gradients and training against torch: installs its CPU build (not part of `make test` or CI)
test-torch: kernels
	$(BIN)/python -m pip install -q -e '.[torch]'
	$(BIN)/python -m pytest -m torch

lint: $(STAMP)
	$(BIN)/ruff check tensorsql planner udf_kernels tests benchmarks

bench: kernels
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) udf_kernels/_build build *.egg-info
