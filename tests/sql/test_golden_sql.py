"""Golden snapshots of lowering: the SQL of a few fixed plans. Regenerate with TENSORSQL_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
import pathlib

import pytest

from tensorsql.backends.duckdb import costs, sqlgen
from tensorsql.compile import lower, rewrite
from tensorsql.frontend import numpy as frontend
from tensorsql.frontend.subscripts import parse, split_args
from tensorsql.ir import expr as E

GOLDEN = pathlib.Path(__file__).parent / "golden"


def src(name, shape, block_shape, dtype="float64"):
    return E.Source(shape=shape, dtype=dtype, table=name, block_shape=block_shape)


def plan_sql(spec, *sources, lowering=sqlgen.FUSED, **kw):
    inputs, output, _ = split_args([spec, *sources])
    node = frontend.build(parse(inputs, output, [x.shape for x in sources]), list(sources), **kw)
    rel = rewrite.physical(lower.lower(node, lower.default_partitioning(node)), costs.PROFILE)
    return sqlgen.sql_text(sqlgen.to_ast(rel, lowering=lowering), pretty=True) + "\n"


#: the GPU executor's lowering (backends/cuda): no fused forms, float kernels bound to device 0
GPU = sqlgen.Lowering(einsum_agg=False, einsum_path=False, device=0)


# cases lowered for both executors (the GPU snapshots show the same plans as device calls)
def matmul_sql(**kw):
    return plan_sql("ij,jk->ik", src("A", (8, 6), (4, 3)), src("B", (6, 10), (3, 5)), **kw)


def chain3_sql(**kw):
    a, b = src("A", (4, 40), (4, 40)), src("B", (40, 3), (40, 3))
    return plan_sql("ij,jk,kl->il", a, b, src("C", (3, 50), (3, 50)), optimize="optimal", **kw)


def transpose_scalar_cast_sql(**kw):
    return plan_sql("ij,->ji", src("A", (3, 2), (3, 2), "int32"), src("s", (), (), "float32"), **kw)


def slice_sql(source, start, count, step, keep):
    shape = tuple(n for n, k in zip(count, keep, strict=True) if k)
    return node_sql(E.Slice(shape, source.dtype, source, start, count, step, keep))


def reblock_sql(source, block_shape):
    return node_sql(E.Reblock(shape=source.shape, dtype=source.dtype, input=source, block_shape=block_shape))


def node_sql(node):
    rel = rewrite.physical(lower.lower(node, lower.default_partitioning(node)), costs.PROFILE)
    return sqlgen.sql_text(sqlgen.to_ast(rel), pretty=True) + "\n"


def many_sql():
    """A shared step (A @ B) as a MATERIALIZED CTE read by two outputs, each written into its own sink."""

    def ein(spec, *xs):
        inputs, output, _ = split_args([spec, *xs])
        node = frontend.build(parse(inputs, output, [x.shape for x in xs]), list(xs))
        return rewrite.physical(lower.lower(node, lower.default_partitioning(node)), costs.PROFILE)

    stage = ein("ij,jk->ik", src("A", (8, 6), (4, 3)), src("B", (6, 10), (3, 5)))
    blocks = tuple(stage.schema.blocks[k] for k in stage.schema.keys)
    shared = src("_ts_shared_0_0", (8, 10), blocks)
    product = ein("ik,kl->il", shared, src("C", (10, 2), (10, 2)))
    outputs = [(ein("ik->", shared), 11, None), (product, 12, None)]
    ast = sqlgen.to_multi_sink_ast([("_ts_shared_0_0", stage, None)], outputs)
    return sqlgen.sql_text(ast, pretty=True) + "\n"


CASES = {
    "many_shared_step": many_sql,
    # A[1:9:2, 3] over 3x4x2 blocks: reads blocks k0 0..2, k1 0; pieces assembled along k0
    "slice_strided_drop": lambda: slice_sql(
        src("A", (10, 7, 5), (3, 4, 2)), (1, 3, 0), (4, 1, 5), (2, 1, 1), (True, False, True)
    ),
    # M[::-1, 2:6]: blocks reversed; columns 2:6 straddle two blocks, so pieces are assembled

    "slice_reversed": lambda: slice_sql(src("M", (8, 8), (4, 4)), (7, 2), (8, 4), (-1, 1), (True, True)),
    # M[4:, :]: one stored block per output block: read only those (the filter), no assembling
    "slice_aligned": lambda: slice_sql(src("M", (8, 8), (4, 4)), (4, 0), (4, 8), (1, 1), (True, True)),
    "matmul": matmul_sql,
    "matmul_ragged_repartition": lambda: plan_sql(
        "ij,jk->ik", src("A", (5, 4), (2, 4)), src("B", (4, 6), (3, 3))
    ),
    # blocks of 2 x 5 merged into 4 x 10 (ragged: 9 rows): each assembled whole where it lies, no slice
    "reblock_merge": lambda: reblock_sql(src("A", (9, 10), (2, 5)), (4, 10)),
    # and back: each target block is a slice of one source block, no assemble
    "reblock_split": lambda: reblock_sql(src("A", (9, 10), (4, 10)), (2, 5)),
    "trace": lambda: plan_sql("ii->", src("M", (6, 6), (3, 3))),
    "l2_distance": lambda: plan_sql(
        "ij,jk->ik", src("X", (4, 6), (2, 3)), src("Y", (6, 4), (3, 2)), join="sqdiff"
    ),
    "chain3": chain3_sql,
    "chain3_split_c": lambda: plan_sql(
        "ij,jk,kl->il",
        src("A", (4, 40), (4, 40)),
        src("B", (40, 3), (40, 3)),
        src("C", (3, 50), (3, 10)),
        optimize="optimal",
    ),
    # the GPU executor: block products on the device, summed by tensor_sum (no tensor_einsum_agg)
    "gpu_matmul": lambda: matmul_sql(lowering=GPU),
    # a fused one-block tree as nested device calls (no tensor_einsum_path)
    "gpu_chain3": lambda: chain3_sql(lowering=GPU),
    # int32 stays on the CPU kernels; the cast to float32 too
    "gpu_transpose_scalar_cast": lambda: transpose_scalar_cast_sql(lowering=GPU),
    "transpose_scalar_cast": transpose_scalar_cast_sql,
}


def check_golden(name: str, got: str, golden: pathlib.Path = GOLDEN) -> None:
    """Compare with the committed snapshot; written only with TENSORSQL_UPDATE_GOLDEN=1."""
    path = golden / f"{name}.sql"
    if os.environ.get("TENSORSQL_UPDATE_GOLDEN"):
        path.write_text(got)
    assert path.exists(), (
        f"no golden file {path.name}: generate it with TENSORSQL_UPDATE_GOLDEN=1 and commit it"
    )
    assert got == path.read_text(), (
        f"SQL for {name} changed; rerun with TENSORSQL_UPDATE_GOLDEN=1 if intended"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_sql(name):
    check_golden(name, CASES[name]())


def test_a_missing_golden_file_fails(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORSQL_UPDATE_GOLDEN", raising=False)
    with pytest.raises(AssertionError, match=r"no golden file matmul\.sql"):
        check_golden("matmul", CASES["matmul"](), tmp_path)
    assert not (tmp_path / "matmul.sql").exists()
