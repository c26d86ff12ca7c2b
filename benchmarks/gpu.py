"""GPU benchmark: tensorsql on a CUDA device against torch on the same device and the CPU peers.

    python -m benchmarks.gpu                         # on a GPU machine (torch with CUDA as the peer)
    python -m benchmarks.gpu --quick --device cuda-emulated   # smoke run of this script, no GPU

Rows, each timed side by side in this process (best of ``--repeat``, alternating):
  matmul host   n x n float32 from numpy arrays to a numpy result: tensorsql on the GPU vs torch
                (``torch.from_numpy(a).cuda() @ ...`` then ``.cpu()``); target <= 1.5x
  matmul stored the operands stored in DuckDB (host memory) vs torch on device-resident tensors;
                target <= 1.3x
                (tensorsql keeps no relation on the device between queries yet: this row measures the gap)
  matmul cpu    tensorsql on the CPU vs numpy, for reference
  TCCG / trees  the einsum-trees paper's cases on the GPU vs opt_einsum on the CPU (target: >= 10x faster,
                a ratio <= 0.1) and vs torch.einsum on the GPU (no target)

Without a usable GPU (or torch with CUDA) the rows that need one are printed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import numpy as np
import opt_einsum

import tensorsql as ts
from benchmarks.__main__ import ROWS, TCCG, TREES, Row, _fit, _rand, _sizes, best_pair, emit, machine


def _torch_cuda() -> tuple[object | None, str]:
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    return torch, ""


def _synced(fn: Callable[[], object], torch: object) -> Callable[[], object]:
    def run() -> object:
        out = fn()
        torch.cuda.synchronize()  # type: ignore[attr-defined]
        return out

    return run


def matmul_rows(s: ts.Session, cpu: ts.Session, n: int, repeat: int, torch: object | None, why: str) -> None:
    rng = np.random.default_rng(1)
    a, b = _rand((n, n), "float32", rng), _rand((n, n), "float32", rng)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = s.einsum("ij,jk->ik", a, b).numpy()
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    note = f"rel-err {err:.1e}" + (" REL-ERR" if err > 1e-4 else "")
    if torch is not None:
        t = torch  # type: ignore[assignment]

        def host() -> np.ndarray:
            return (t.from_numpy(a).cuda() @ t.from_numpy(b).cuda()).cpu().numpy()

        ts_t, peer_t = best_pair(lambda: s.einsum("ij,jk->ik", a, b).numpy(), host, repeat)
        emit(Row("gpu", f"matmul host {n}^2 float32", ts_t, "torch-host", peer_t, 1.5, note))
        A, B = s.from_numpy(a), s.from_numpy(b)
        da, db = t.from_numpy(a).cuda(), t.from_numpy(b).cuda()
        rel = A @ B
        ts_t, peer_t = best_pair(rel.numpy, _synced(lambda: da @ db, t), repeat)
        emit(
            Row(
                "gpu",
                f"matmul stored {n}^2 float32",
                ts_t,
                "torch-dev",
                peer_t,
                1.3,
                "tensorsql: operands stored in DuckDB (host); no device-resident relations yet",
            )
        )
    else:
        print(f"  [gpu] matmul {n}^2: torch rows skipped ({why}); tensorsql {note}")
    A, B = cpu.from_numpy(a), cpu.from_numpy(b)
    ts_t, peer_t = best_pair((A @ B).numpy, lambda: a @ b, repeat)
    emit(Row("gpu", f"matmul cpu {n}^2 float32 (stored)", ts_t, "numpy", peer_t, None, "the CPU executor"))


def tccg_rows(s: ts.Session, repeat: int, quick: bool, torch: object | None) -> None:
    limit = 200_000 if quick else 24_000_000
    rng = np.random.default_rng(3)
    cases = [(f"TCCG {i:2d}", spec, sizes) for i, spec, sizes in TCCG] + list(TREES)
    for name, spec, sizes in cases:
        sz, _scale = _fit(spec, _sizes(spec, sizes), limit)
        arrays = [_rand(tuple(sz[c] for c in t), "float32", rng) for t in spec.split("->")[0].split(",")]
        want = opt_einsum.contract(spec, *arrays)
        rel = s.einsum(spec, *arrays)
        got = rel.numpy()
        err = float(np.max(np.abs(got - want))) / (float(np.max(np.abs(want))) or 1.0)
        note = f"rel-err {err:.1e}" + (" REL-ERR" if err > 1e-3 else "")
        ts_t, cpu_t = best_pair(
            rel.numpy, lambda spec=spec, arrays=arrays: opt_einsum.contract(spec, *arrays), repeat
        )
        emit(Row("gpu", f"{name} {spec}", ts_t, "opt_einsum", cpu_t, 0.1, note))
        if torch is not None:
            t = torch  # type: ignore[assignment]
            dev = [t.from_numpy(x).cuda() for x in arrays]
            ts_t, tg = best_pair(
                rel.numpy, _synced(lambda spec=spec, dev=dev, t=t: t.einsum(spec, *dev), t), repeat
            )
            emit(Row("gpu", f"{name} vs torch.einsum (device tensors)", ts_t, "torch-dev", tg, None, ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:<n> or cuda-emulated (a smoke run)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--sizes", default="4096,8192", help="matmul sizes")
    args = ap.parse_args(argv)
    print(machine())
    try:
        s = ts.connect(device=args.device)
    except ts.DeviceError as exc:
        print(f"no GPU session: {exc}")
        return 2
    print(f"device: {s.executor.device_info}")  # type: ignore[attr-defined]
    torch, why = _torch_cuda()
    if args.device == "cuda-emulated":
        torch, why = None, "the emulated device is no GPU"
    t0 = time.perf_counter()
    sizes = [64, 128] if args.quick else [int(x) for x in args.sizes.split(",")]
    with s, ts.connect() as cpu:
        for n in sizes:
            matmul_rows(s, cpu, n, args.repeat, torch, why)
        tccg_rows(s, args.repeat, args.quick, torch)
    print(f"total {time.perf_counter() - t0:.1f} s")
    failed = [r for r in ROWS if r.verdict == "FAIL"]
    geo = math.exp(sum(math.log(r.ratio) for r in ROWS) / len(ROWS)) if ROWS else float("nan")
    print(f"rows {len(ROWS)}, failed {len(failed)}, geometric mean ratio {geo:.3f}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
