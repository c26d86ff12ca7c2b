#!/usr/bin/env bash
# The GPU checks of issue 17 in one call on a GPU machine (README "GPUs (CUDA)"): set up, build, test, measure.
#
# The GPU machine has no package index. The Python packages tensorsql needs that its image lacks are installed
# from a folder of wheels carried with the call (WHEELS, default ./wheels): cp312 manylinux wheels of
# duckdb==2.0.0, sqlglot, opt_einsum, scipy-openblas32, rich, prompt_toolkit, pytest (and pyarrow or numpy if
# the image lacks them), fetched beforehand with
#   pip download -d wheels --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux2014_x86_64 duckdb==2.0.0 sqlglot opt_einsum scipy-openblas32 rich prompt_toolkit pytest
# DuckDB's C headers come from udf_kernels/_build/include (an ignored path: carry it). The venv is made with
# the image's own packages (torch built for CUDA, numpy) visible.
#
# Usage: bash benchmarks/gpu_device.sh [quick]      (quick: the benchmark at small sizes)
# Every step runs even when one before it failed; the exit status is the number of failed steps.
set -uo pipefail
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-wheels}
VENV=${VENV:-/tmp/tensorsql-gpu-venv}
failed=0
step() {
	echo "== $*"
	"$@" || { echo "!! failed: $*"; failed=$((failed + 1)); }
}

"$PY" -m venv --system-site-packages "$VENV" || exit 1
PYBIN="$VENV/bin/python"
missing=$("$PYBIN" - <<'EOF'
import importlib.util

need = {
    "duckdb": "duckdb==2.0.0", "pyarrow": "pyarrow", "numpy": "numpy", "sqlglot": "sqlglot",
    "opt_einsum": "opt_einsum", "scipy_openblas32": "scipy-openblas32", "rich": "rich",
    "prompt_toolkit": "prompt_toolkit", "pytest": "pytest",
}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
	# shellcheck disable=SC2086
	step "$PYBIN" -m pip install -q --no-index --find-links "$WHEELS" $missing
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
step "$PYBIN" -m udf_kernels.build --no-cuda
TENSORSQL_CUDA_ARCHS=${TENSORSQL_CUDA_ARCHS:-90} step "$PYBIN" -m udf_kernels.gpu_build
step "$PYBIN" -c "import tensorsql as ts; s = ts.connect(device='cuda'); print(s.executor.device_info); s.close()"
step "$PYBIN" -m pytest -q -p no:randomly -p no:cacheprovider -m gpu tests/test_gpu.py
if [ "${1:-}" = quick ]; then
	step "$PYBIN" -m benchmarks.gpu --quick --repeat 2
else
	step "$PYBIN" -m benchmarks.gpu --repeat 3
fi
echo "failed steps: $failed"
exit "$failed"
