# The two set-up commands: `make demo` and `make test`. Each creates .venv when missing and builds the
# kernels; every step says what it does first (the first run compiles the C++ kernels for a few minutes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# tensorsql and what it needs to run (make demo)
STAMP := $(VENV)/.installed
# plus the test and cluster extras (make test, make lint)
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test test-torch test-gpu lint bench docs kernels kernels-cuda kernels-emulated clean

$(STAMP): pyproject.toml setup.py
	@echo "== creating $(VENV) and installing tensorsql's dependencies (first run only, about a minute)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	@echo "== installing the test tools: pytest, hypothesis, ruff, dask (first run only)"
	$(BIN)/python -m pip install -q -e '.[test,distributed]'
	touch $(TEST_STAMP)

# the CPU kernels, and the CUDA kernels where a CUDA device is visible (python -m udf_kernels.make --help)
kernels: $(STAMP)
	@echo "== building the kernel extension (minutes the first time; then only when its sources change)"
	$(BIN)/python -m udf_kernels.make

# the CUDA kernel set, wherever nvcc is (also without a GPU: a compile check)
kernels-cuda: $(STAMP)
	@echo "== building the kernel extension and the CUDA kernel set (nvcc)"
	$(BIN)/python -m udf_kernels.make --cuda

# the GPU kernel set with its host emulation: connect(device="cuda-emulated"), which the tests use
kernels-emulated: kernels
	@echo "== building the emulated GPU kernel set (first time only: seconds to a minute)"
	$(BIN)/python -m udf_kernels.gpu_build --emulated

demo: kernels
	@echo "== running the demo: python -m tensorsql.demo"
	$(BIN)/python -m tensorsql.demo

test: $(TEST_STAMP) kernels-emulated
	@echo "== running the test suite: pytest (several minutes)"
	$(BIN)/python -m pytest

# gradients and training against torch: installs its CPU build (not part of `make test` or CI)
test-torch: $(TEST_STAMP) kernels
	@echo "== installing torch's CPU build, then running the torch tests"
	$(BIN)/python -m pip install -q -e '.[torch]'
	$(BIN)/python -m pytest -m torch

# on a machine with a CUDA GPU: the GPU kernel set built for it, then every GPU test (tests/gpu/test_gpu.py) and
# the GPU benchmark (benchmarks/gpu.py; torch built for CUDA is its peer)
test-gpu: $(TEST_STAMP) kernels-cuda
	@echo "== running the GPU tests, then the GPU benchmark"
	$(BIN)/python -m pytest -m gpu tests/gpu/test_gpu.py
	$(BIN)/python -m benchmarks.gpu

lint: $(TEST_STAMP)
	@echo "== linting: ruff check"
	$(BIN)/ruff check tensorsql planner udf_kernels tests benchmarks

bench: kernels
	@echo "== installing the benchmark extras, then running the benchmarks"
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks

# the documentation site (mkdocs.yml) into site/, warnings as errors
docs: kernels
	@echo "== installing mkdocs, then building the documentation site into site/"
	$(BIN)/python -m pip install -q -e '.[docs]'
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) udf_kernels/_build build dist site *.egg-info
