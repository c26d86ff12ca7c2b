"""The embedded DuckDB engine's own terms, measured on the project's machines (docs "EinDecomp"): what the
planner and the physical passes weigh on this engine, beyond the kernels' per-call/per-byte/per-flop model."""

from __future__ import annotations

from tensorsql.backends.base import EngineProfile

#: seconds per byte a join hands through DuckDB on the project's machine (64 joined pairs of 4 MiB blocks,
#: 512 MiB, in ~0.15 s); a repartition (per_byte) costs ~20x more per byte: it slices and re-assembles in SQL
JOIN_BYTE = 3e-10
#: a kernel call of this many flops per worker or more runs as one threaded GEMM about as fast as split
#: calls do (2 workers: a 4096^2 float32 matmul as one block 1.02x numpy's time, as two row panels 1.12x;
#: the 1.2 GFLOP step of benchmark (d)'s TRN tree 15 ms against 17 ms), so fewer, larger blocks lose no
#: parallelism. Its permutes and copies stay serial: the square chain's 2 GFLOP calls measured ~1.1x slower
#: as single blocks than split (RESULTS.md).
SPLIT_FLOPS = 1e8
#: seconds a contraction costs as a query step of its own (join, group-by, result blob, pipeline) beyond its
#: kernel work: what fusing it into its consumer's kernel call saves (``compile.fuse.fused_steps``). Steps of
#: a few hundred microseconds of GEMM measured 0.6-0.9 ms each as steps of one query (benchmark (d)'s TRN).
STEP_SECONDS = 5e-4
#: joins of fewer block pairs than this compute their left side's block shapes on that side (``tensor_pin``):
#: DuckDB's join operators buffer outputs of fewer than 64 rows, copying every blob of every joined pair,
#: unless the output holds a LIST column
PIN_PAIRS = 4096

PROFILE = EngineProfile(
    join_byte=JOIN_BYTE,
    split_flops=SPLIT_FLOPS,
    step_seconds=STEP_SECONDS,
    pin_pairs=PIN_PAIRS,
    side_joins=True,
)

__all__ = ["JOIN_BYTE", "PIN_PAIRS", "PROFILE", "SPLIT_FLOPS", "STEP_SECONDS"]
