# The two set-up commands: `make demo` and `make test`. Each creates .venv when missing and builds the kernels.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-torch test-gpu lint bench kernels clean

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

# on a machine with a CUDA GPU: the GPU kernel set built for it, then every GPU test (tests/test_gpu.py) and the
# GPU benchmark (benchmarks/gpu.py; torch built for CUDA is its peer)
test-gpu: kernels
	$(BIN)/python -m udf_kernels.gpu_build
	$(BIN)/python -m pytest -m gpu tests/test_gpu.py
	$(BIN)/python -m benchmarks.gpu

lint: $(STAMP)
	$(BIN)/ruff check tensorsql planner udf_kernels tests benchmarks

bench: kernels
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) udf_kernels/_build build *.egg-info
