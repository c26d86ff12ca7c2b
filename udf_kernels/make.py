"""Build every kernel set this machine can run: ``python -m udf_kernels.make`` (what ``make kernels`` runs).

- the CPU extension, ``tensorsql_kernels``, always (``udf_kernels.build``);
- the CUDA kernel set, ``tensorsql_cuda``, where a CUDA device is visible, or when asked with ``--cuda`` or
  ``TENSORSQL_BUILD_CUDA=1`` (``--no-cuda`` or ``TENSORSQL_BUILD_CUDA=0`` skip it): nvcc alone is no reason
  to spend minutes on code that cannot run here (``udf_kernels.gpu_build``);
- the emulated GPU kernel set, ``tensorsql_cuda_emulated``, with ``--emulated`` (the tests' GPU device).

The driver is its own module so that the two builds stay one-way: ``gpu_build`` imports ``build``, this
imports both, and nothing imports this.
"""

from __future__ import annotations

import argparse
import sys

from udf_kernels import build, gpu_build
from udf_kernels._errors import KernelBuildError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m udf_kernels.make", description="Build the kernel sets this machine can run."
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the sources did not change")
    cuda = parser.add_mutually_exclusive_group()
    cuda.add_argument("--cuda", dest="cuda", action="store_true", default=None, help="build the CUDA set")
    cuda.add_argument("--no-cuda", dest="cuda", action="store_false", help="never build the CUDA kernel set")
    parser.add_argument("--emulated", action="store_true", help="build the emulated GPU kernel set too")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Builds what the arguments and the machine call for, printing each extension's path on stdout and the
    progress, and why the CUDA set is built or not, on stderr."""
    args = _parser().parse_args(argv)
    try:
        wanted, why = gpu_build.cuda_wanted(args.cuda)  # first: a mistyped variable fails fast
        print(build.build(force=args.force), flush=True)
        if args.emulated:
            print(gpu_build.build(emulated=True, force=args.force), flush=True)
        if not wanted:
            build.say(f"the CUDA kernel set is not built: {why} (`make kernels-cuda` builds it)")
        elif gpu_build.find_nvcc() is None and why == "a CUDA device is visible":
            build.say("the CUDA kernel set is not built: a CUDA device is visible but there is no nvcc")
        else:
            print(gpu_build.build(force=args.force), flush=True)
    except KernelBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
