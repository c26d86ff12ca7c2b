#!/usr/bin/env bash
# The GPU and many-core checks in one call on a GPU machine (docs "GPUs").
#
# The GPU machine has no package index. What its Python lacks is installed from a folder of wheels carried
# with the call (WHEELS, default ./.whl), fetched beforehand for its Python (3.12) with
#   pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#       duckdb==2.0.0 sqlglot scipy-openblas32 prompt_toolkit wcwidth \
#       dask distributed tornado locket partd tblib zict        # the last line: the cluster rows only
# The kernels are built there from source (udf_kernels/_build/include, DuckDB's C headers, must be carried),
# unless TENSORSQL_PREBUILT=1 says the carried udf_kernels/_build already holds both kernel sets built from
# this tree (the CPU set dispatches on the CPU at run time; the GPU set built with TENSORSQL_CUDA_ARCHS=90):
# that saves device minutes.
#
# Usage: bash benchmarks/gpu_device.sh [quick]      (quick: the benchmarks at small sizes)
# Full logs go to $OUT (or /tmp/tensorsql-gpu-logs). Every step runs under its own time limit, also when one
# before it failed; the exit status is the number of failed steps.
set -uo pipefail
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/tensorsql-site}
LOG=${OUT:-/tmp/tensorsql-gpu-logs}
QUICK=${1:-}
mkdir -p "$LOG"
failed=0
step() { # step LIMIT_S LOGNAME CMD...: run CMD under a time limit, its output to the terminal and LOG/LOGNAME
	local limit=$1 name=$2
	shift 2
	echo "== [t=${SECONDS}s] $* (limit ${limit}s)"
	timeout "$limit" "$@" 2>&1 | tee "$LOG/$name" | tail -n 40
	local rc=${PIPESTATUS[0]}
	[ "$rc" -eq 0 ] || { echo "!! failed (exit $rc): $*"; failed=$((failed + 1)); }
}

if compgen -G "$WHEELS/*.whl" >/dev/null; then
	"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
		"$WHEELS"/*.whl || exit 1
	export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
# the CPU kernels link scipy-openblas32's library; a carried prebuilt extension finds it through this path
BLAS_LIB=$("$PY" -c "import scipy_openblas32; print(scipy_openblas32.get_lib_dir())") || exit 1
export LD_LIBRARY_PATH="$BLAS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "${TENSORSQL_PREBUILT:-0}" = 1 ]; then
	touch udf_kernels/_build/*.duckdb_extension # newer than the copied sources: used as they are
fi
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
	echo "cpus: $(nproc); $(lscpu | grep -m1 'Model name')"
	"$PY" -c "import sys, duckdb, numpy, pyarrow, torch; print(sys.version.split()[0], 'duckdb', duckdb.__version__,
		'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__, 'torch', torch.__version__)"
} 2>&1 | tee "$LOG/machine.txt"
step 400 build_cpu.log "$PY" -m udf_kernels.build --no-cuda
export TENSORSQL_CUDA_ARCHS=${TENSORSQL_CUDA_ARCHS:-90}
step 400 build_gpu.log "$PY" -m udf_kernels.gpu_build
step 60 session.log "$PY" -c "
import numpy as np, tensorsql as ts
s = ts.connect(device='cuda')
print(s.executor.device_info)
rng = np.random.default_rng(0)
a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
got = s.einsum('ij,jk->ik', a, b).numpy()
print('matmul max abs err', float(np.max(np.abs(got - a @ b))))
s.close()"
step 240 pytest_gpu.log "$PY" -m pytest -q -p no:randomly -p no:cacheprovider -m gpu tests/gpu/test_gpu.py \
	--tb=short -rfE
if [ "$QUICK" = quick ]; then
	step 120 bench_gpu.log "$PY" -m benchmarks.gpu --quick --repeat 2
else
	step 200 bench_gpu.log "$PY" -m benchmarks.gpu --repeat 3
fi
# many cores: the 4096^2 matmul and the TCCG/einsum-tree rows at all of the machine's threads
step 200 bench_cpu.log "$PY" -m benchmarks --only a,d --repeat 3 ${QUICK:+--quick}
if "$PY" -c "import distributed" 2>/dev/null; then
	step 200 bench_cluster.log "$PY" -m benchmarks.cluster --workers 1,4,8 --repeat 2
fi
echo "failed steps: $failed (t=${SECONDS}s)"
exit "$failed"
