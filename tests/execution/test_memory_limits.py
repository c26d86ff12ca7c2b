"""Bounded memory (docs "Memory and limits"): the per-block byte cap, memory_limit / temp_directory, the
kernels' own memory budget and its typed OutOfMemoryError, storage a scan can stream, and repeated labels
under forced blocks reading only diagonal blocks. Every case is cheap: small caps and limits stand in for
multi-GB tensors."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
from tolerance import assert_close, assert_einsum_close, elementwise_tolerance

import planner as P
import tensorsql as ts
from tensorsql.backends.duckdb import errors as duck_errors
from tensorsql.backends.duckdb import memory, sqlgen
from tensorsql.dtypes import DTYPES
from tensorsql.errors import ConfigError, KernelError, OutOfMemoryError, TensorSQLError
from tensorsql.ir import tra as T
from tensorsql.ir.blocking import MAX_BLOCK_BYTES

CAP = 64 << 10  # 64 KiB: a 300 x 200 float64 result (480 KB) needs 8 blocks or more
STRATEGIES = ["eindecomp", "sqrt", "data", "model", "none", "operands"]


@pytest.fixture(scope="module")
def capped():
    s = ts.connect(threads=2, max_block_bytes=CAP)
    yield s
    s.close()


def _tra_nodes(rel: T.Rel) -> list[T.Rel]:
    seen: dict[T.Rel, None] = {}
    stack = [rel]
    while stack:
        r = stack.pop()
        if r not in seen:
            seen[r] = None
            stack.extend(T.inputs(r))
    return list(seen)


def _block_bytes(schema: T.Schema) -> int:
    """Bytes of the largest block of a TRA relation: its blob labels' block extents, clipped to the sizes."""
    extents = [min(schema.blocks[lab], max(1, schema.sizes[lab])) for lab in schema.blob]
    return math.prod(extents) * DTYPES[schema.dtype].itemsize


def assert_blocks_within(plan, cap: int) -> None:
    """Every block the plan makes (inputs as read, joined pairs, intermediates, the output) fits the cap;
    stored relations keep the blocks they were stored with."""
    for rel in _tra_nodes(plan.tra):
        if isinstance(rel, T.Scan):
            continue
        assert _block_bytes(rel.schema) <= cap, (type(rel).__name__, rel.schema.blocks, rel.schema.sizes)


# ---- the block cap ---------------------------------------------------------------------------------------
def test_a_result_over_the_cap_is_split_and_correct(capped):
    a, b = np.arange(300.0), np.arange(200.0) - 7
    rel = capped.einsum("i,j->ij", a, b)
    plan = rel.plan()
    assert_blocks_within(plan, CAP)
    grid = [-(-n // bs) for n, bs in zip(plan.root.shape, plan.block_shape(), strict=True)]
    assert math.prod(grid) >= 8
    np.testing.assert_array_equal(rel.numpy(), np.outer(a, b))
    assert rel.to_arrow().num_rows == math.prod(grid)  # the Arrow path streams the same blocks


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_keeps_every_block_within_the_cap(capped, strategy):
    rng = np.random.default_rng(1)
    x, w, v = rng.standard_normal((120, 90)), rng.standard_normal((90, 70)), rng.standard_normal((70,))
    rel = capped.einsum("ij,jk,k->ij", x, w, v, strategy=strategy)
    assert_blocks_within(rel.plan(), CAP)
    assert_einsum_close(rel.numpy(), "ij,jk,k->ij", x, w, v)


def test_forced_blocks_are_split_further_to_fit_the_cap(capped):
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((150, 80)), rng.standard_normal((80, 60))
    rel = capped.einsum("ij,jk->ik", x, y, blocks={"j": 1})
    assert_blocks_within(rel.plan(), CAP)
    assert_einsum_close(rel.numpy(), "ij,jk->ik", x, y)


def test_stored_inputs_bigger_than_the_cap_are_read_in_capped_blocks(capped):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((100, 100)), rng.standard_normal((100, 50))
    X = capped.from_numpy(x, block_shape=(100, 100))  # one 80 KB block: stored as given
    Y = capped.from_numpy(y)
    rel = capped.einsum("ij,jk->ik", X, Y)
    assert_blocks_within(rel.plan(), CAP)
    assert_einsum_close(rel.numpy(), "ij,jk->ik", x, y)
    mapped = capped.map(X, "exp")  # maps, and their inputs as read, too
    assert_blocks_within(mapped.plan(), CAP)
    want = np.exp(x)
    assert_close(mapped.numpy(), want, elementwise_tolerance(want, np.float64))


def test_the_default_cap_splits_the_4_gib_outer_product_without_running_it(s):
    """``einsum("i,j->ij", ones(24000), ones(24000))``: planned as one 4.6 GB block, which the
    kernels refuse (a blob holds at most 4 GiB). Planned here over placeholders, so nothing is computed."""
    u = s.placeholder((24000,), "float64")
    rel = s.einsum("i,j->ij", u, s.placeholder((24000,), "float64"))
    assert_blocks_within(rel.plan(), s.executor.max_block_bytes)
    assert s.executor.max_block_bytes <= MAX_BLOCK_BYTES
    a, b = (s.placeholder((30000, 30000), "float32") for _ in range(2))
    big = s.einsum("ij,jk->ik", a, b)  # planned as one 3.6 GB block per tensor
    assert_blocks_within(big.plan(), s.executor.max_block_bytes)


def test_the_cap_comes_from_connect_the_environment_or_the_memory_limit(monkeypatch):
    with ts.connect(max_block_bytes="128KiB") as s:
        assert s.executor.max_block_bytes == 128 << 10
        assert s.executor.profile.max_block_bytes == 128 << 10
    monkeypatch.setenv("TENSORSQL_MAX_BLOCK_BYTES", "200000")
    with ts.connect() as s:
        assert s.executor.max_block_bytes == 200000
    monkeypatch.delenv("TENSORSQL_MAX_BLOCK_BYTES")
    with ts.connect(threads=2, memory_limit="64MB") as s:  # a small limit gives a small default cap
        assert s.executor.max_block_bytes == 64_000_000 // (8 * 2)


@pytest.mark.parametrize("bad", [0, -5, True, 1.5, "lots", "12 parsecs", 512, 1 << 40, None])
def test_a_bad_block_cap_is_a_config_error(monkeypatch, bad):
    if bad is None:  # the environment's value is checked like the argument
        monkeypatch.setenv("TENSORSQL_MAX_BLOCK_BYTES", "huge")
    with pytest.raises(ConfigError, match=r"max_block_bytes|TENSORSQL_MAX_BLOCK_BYTES"):
        ts.connect(max_block_bytes=bad)


def test_the_planner_chooses_among_partitionings_that_fit():
    g = P.EinGraph()
    a, b = g.input("a", (200, 300)), g.input("b", (300, 100))
    g.einsum("ij,jk->ik", a, b)
    for strategy in ("eindecomp", "sqrt", "data", "model", "none"):
        plan = P.decompose(g, 2, strategy, P.CostModel(), max_block=2000)
        for v, parts in plan.partitions.items():
            if v.einsum is None:
                continue
            blocks = P.costs.block_elements(v.einsum, np.array([[parts[lab] for lab in v.einsum.labels]]))
            assert blocks[0] <= 2000, (strategy, parts)
    assert P.choose_p(g, 2, P.CostModel(), max_block=2000) in (1, 2)
    with pytest.raises(P.PlanningError, match="max_block"):
        P.decompose(g, 2, max_block=0)


def test_split_to_fit_halves_only_what_overflows():
    sizes = {"i": 1000, "j": 10}
    assert P.split_to_fit(sizes, [(("i", "j"), 8)], 8 * 1000) == {"i": 63, "j": 10}
    assert P.split_to_fit(sizes, [(("i", "j"), 8)], 10**9) == sizes
    with pytest.raises(P.PlanningError):
        P.split_to_fit(sizes, [(("i",), 16)], 8)


# ---- memory_limit and temp_directory -----------------------------------------------------------------------
def test_connect_takes_a_memory_limit_and_a_temp_directory(tmp_path):
    spill = tmp_path / "spill"
    with ts.connect(memory_limit="64MB", temp_directory=spill) as s:
        assert s.executor.memory_limit == 64_000_000
        assert s.executor.kernel_memory() == (0, 64_000_000)
        limit, tmp = s.execute("SELECT current_setting('memory_limit'), current_setting('temp_directory')")[0]
        assert limit == "61.0 MiB" and tmp == str(spill)
    with ts.connect(memory_limit=48 << 20) as s:  # an int is bytes
        assert s.executor.memory_limit == 48 << 20
    with ts.connect() as s:  # shares of DuckDB's default that leave 10% of it over together (each at 80%
        # of the machine's memory, a runaway query grew to all of it and the system killed the process)
        duckdb_limit, kernels = s.executor.memory_limit, s.executor.kernel_memory()[1]
        assert kernels > 0 and abs(kernels - duckdb_limit / 2) <= 1
        shown = s.execute("SELECT current_setting('memory_limit')")[0][0]
        assert abs(memory.parse_size(shown.replace(" ", ""), "m") - duckdb_limit) < duckdb_limit / 50


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "", "much", "10 parsecs", "1MB", "150%", b"1GB", 2**64])
def test_a_bad_memory_limit_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="memory_limit"):
        ts.connect(memory_limit=bad)


def test_a_bad_temp_directory_is_a_config_error(tmp_path):
    afile = tmp_path / "not_a_dir"
    afile.write_text("x")
    for bad in (afile, 42, ""):
        with pytest.raises(ConfigError, match="temp_directory"):
            ts.connect(temp_directory=bad)


@pytest.fixture(scope="module")
def limited():
    s = ts.connect(threads=2, memory_limit="32MB")
    yield s
    s.close()


def test_a_kernel_allocation_over_the_limit_is_an_out_of_memory_error(limited):
    """tensor_zeros of 2 GB under a 200 MB limit succeeded at 3.9 GB RSS; a kernel's buffers are
    charged to the session's limit before they are allocated, so this one fails without touching 64 MB."""
    pattern = r"tensor_zeros: .*allocating \d+ bytes for the zero block .*of 32000000 bytes.*memory_limit="
    with pytest.raises(OutOfMemoryError, match=pattern) as info:
        limited.execute("SELECT tensor_zeros('float64', [8000000])")
    assert isinstance(info.value, MemoryError) and isinstance(info.value, TensorSQLError)
    assert not isinstance(info.value, KernelError)
    assert limited.executor.kernel_memory()[0] == 0  # released on the failure
    assert limited.execute("SELECT octet_length(tensor_zeros('float64', [1000]))") == [(8000,)]


def test_an_einsum_block_over_the_limit_is_an_out_of_memory_error(tmp_path):
    """A block the session's cap allows but its memory does not (a cap set above the limit)."""
    with ts.connect(memory_limit="32MB", max_block_bytes="64MiB") as s:
        a = np.ones(3000)
        rel = s.einsum("i,j->ij", a, a)  # one 72 MB block
        with pytest.raises(OutOfMemoryError, match=r"tensor_einsum.*bytes.*connect\(memory_limit=") as info:
            rel.to_arrow()
        assert "rejected its input" not in str(info.value)
        assert s.executor.kernel_memory()[0] == 0


def test_duckdbs_own_out_of_memory_is_the_same_typed_error(limited):
    with pytest.raises(OutOfMemoryError, match=r"DuckDB ran out of memory.*memory_limit=") as info:
        limited.execute("SELECT list(range) FROM range(20000000)")
    assert not isinstance(info.value, KernelError)
    oom = duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate")
    wrapped = duck_errors.wrap(oom, "einsum")
    assert isinstance(wrapped, OutOfMemoryError) and str(wrapped).startswith("einsum: ")
    # a commit that could not pin a block (a save over the limit) is out of memory too, not a SQL error
    commit = duckdb.TransactionException("TransactionContext Error: Failed to commit: failed to pin block")
    assert isinstance(duck_errors.wrap(commit, "save 'X'"), OutOfMemoryError)
    # DuckDB's IO error inside a kernel's call (a spill directory it cannot make) is no kernel's rejection
    io = duckdb.InvalidInputException('tensor_slice: internal error: {"exception_type":"IO"}')
    assert not isinstance(duck_errors.wrap(io, "materialize"), KernelError)


def test_from_numpys_default_blocks_keep_within_the_block_cap():
    """A small memory_limit's block cap bounds from_numpy's default blocks too (6.3 MiB blocks under a
    1 MiB cap left the waves no room: out of memory)."""
    with ts.connect(memory_limit="16MB") as s:
        cap = s.executor.max_block_bytes
        a = np.random.default_rng(1).standard_normal((1500, 1100))
        rel = s.from_numpy(a)
        assert np.prod(rel.block_shape) * 8 <= cap
        b = np.random.default_rng(2).standard_normal((1100, 300))
        np.testing.assert_allclose((rel[:, ::-1] @ b).numpy(), a[:, ::-1] @ b, rtol=1e-10, atol=1e-10)
        assert s.from_numpy(a, block_shape=(1500, 1100)).block_shape == (1500, 1100)  # given: kept


def test_results_within_the_limit_still_work(limited):
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
    assert_einsum_close(limited.einsum("ij,jk->ik", x, y).numpy(), "ij,jk->ik", x, y)
    assert limited.executor.kernel_memory()[0] == 0


def _save(path: str, x: np.ndarray, block_shape: tuple[int, ...], *, zstd: bool = False) -> list[tuple]:
    """Saves x as table X of a database file; returns the compressions its blobs were stored with."""
    with ts.connect(path) as s:
        if zstd:  # what DuckDB chose before tensorsql turned it off
            s.execute("SET disabled_compression_methods = ''")
        s.from_numpy(x, block_shape=block_shape).save("X")
        s.execute("CHECKPOINT")
        return s.execute(
            "SELECT DISTINCT compression FROM pragma_storage_info('X') "
            "WHERE column_name = 'tensor' AND segment_type = 'BLOB'"
        )


def test_a_stored_table_is_read_without_a_table_sized_buffer(tmp_path):
    """20000^2 float32 table (1.6 GB) under a 2 GB limit failed in 0.4 s: ZSTD makes DuckDB
    decompress a row group's blobs into one buffer of the next power of two (2 GiB). Tables are now stored
    uncompressed and read block by block; the same table compressed still fails, with the typed error."""
    x = np.random.default_rng(5).standard_normal((1024, 6144))  # 48 MiB in 48 blocks of 1 MiB
    plain, packed = str(tmp_path / "plain.duckdb"), str(tmp_path / "zstd.duckdb")
    assert ("ZSTD",) not in _save(plain, x, (128, 1024))
    assert _save(packed, x, (128, 1024), zstd=True) == [("ZSTD",)]
    with ts.connect(plain, threads=2, memory_limit="64MB", read_only=True) as s:
        np.testing.assert_array_equal(s.table("X").numpy(), x)
    with (
        ts.connect(packed, threads=2, memory_limit="64MB", read_only=True) as s,
        pytest.raises(OutOfMemoryError, match="DuckDB ran out of memory"),
    ):
        s.table("X").numpy()


def test_a_table_of_many_small_blocks_streams_through_a_smaller_limit(tmp_path):
    """DuckDB reads a table 2048 rows at a time: one of more blocks than that streams through a limit smaller
    than itself (48 MiB of 8 KiB blocks under 32 MB)."""
    path = str(tmp_path / "t.duckdb")
    x = np.random.default_rng(6).standard_normal((1024, 6144))
    _save(path, x, (16, 64))
    with ts.connect(path, threads=2, memory_limit="32MB", read_only=True) as s:
        X = s.table("X")
        np.testing.assert_array_equal(X.numpy(), x)
        np.testing.assert_array_equal(s.einsum("ij->ji", X).numpy(), x.T)
        assert_einsum_close(s.einsum("ij->j", X).numpy(), "ij->j", x)


# ---- repeated labels under forced blocks -------------------------------------------------------------------
def _repartitions(plan) -> list[T.Repartition]:
    return [r for r in _tra_nodes(plan.tra) if isinstance(r, T.Repartition)]


def _rows_of(s, rel: T.Rel) -> int:
    """How many blocks a TRA node makes, by running its own SQL."""
    query = sqlgen.to_ast(rel)
    return s.execute(f"SELECT count(*) FROM ({sqlgen.sql_text(query)})")[0][0]


def test_a_trace_under_forced_blocks_reads_only_diagonal_blocks(s):
    """``einsum('ffff->', x, blocks={'f': 4})`` peaked at 2.37 GB for a 13.6 MB input: the
    re-split made all 4^4 blocks (and copied each source block into every piece). Only the 4 diagonal ones."""
    x = np.random.default_rng(6).integers(-3, 4, size=(12, 12, 12, 12)).astype(np.int32)
    X = s.from_numpy(x, block_shape=(6, 6, 12, 12))
    rel = s.einsum("ffff->", X, blocks={"f": 4})
    (rep,) = _repartitions(rel.plan())
    assert rep.diagonal == ((0, 1, 2, 3),)
    assert _rows_of(s, rep) == 4  # not 4**4
    assert int(rel.numpy()) == int(np.einsum("ffff->", x))


@pytest.mark.parametrize(
    ("eq", "shapes", "block_shapes", "blocks"),
    [
        ("iij,jk->ik", [(9, 9, 5), (5, 4)], [(4, 9, 5), (5, 4)], {"i": 3, "j": 2}),
        ("ii->i", [(10, 10)], [(10, 3)], {"i": 4}),
        ("ijji->ij", [(6, 5, 5, 6)], [(6, 5, 5, 6)], {"i": 2, "j": 5}),
        ("kiik,k->i", [(4, 7, 7, 4), (4,)], [(2, 7, 3, 4), (4,)], {"i": 7, "k": 2}),
    ],
)
def test_repeated_labels_under_forced_blocks_make_only_diagonal_blocks(s, eq, shapes, block_shapes, blocks):
    rng = np.random.default_rng(7)
    ops = [rng.standard_normal(shape) for shape in shapes]
    rels = [s.from_numpy(o, block_shape=bs) for o, bs in zip(ops, block_shapes, strict=True)]
    rel = s.einsum(eq, *rels, blocks=blocks)
    for rep in _repartitions(rel.plan()):
        if not rep.diagonal:
            continue
        schema = rep.schema
        per_key = [schema.nblocks(k) for k in schema.keys]
        tied = {i for group in rep.diagonal for i in group}
        diagonal = math.prod(n for i, n in enumerate(per_key) if i not in tied)
        diagonal *= math.prod(min(per_key[i] for i in group) for group in rep.diagonal)
        assert _rows_of(s, rep) <= diagonal < math.prod(per_key)
    assert_einsum_close(rel.numpy(), eq, *ops)


def test_sessions_on_one_file_share_the_default_limit(tmp_path):
    """One process's sessions on a file share one DuckDB database: each took a share of the limit the one
    before had set, so the shared limit shrank by a quarter a session (found by review)."""
    path = str(tmp_path / "shared.duckdb")
    with ts.connect(path) as a, ts.connect(path) as b, ts.connect(path) as c:
        shown = {x.execute("SELECT current_setting('memory_limit')")[0][0] for x in (a, b, c)}
        assert len(shown) == 1
        assert abs(c.executor.memory_limit - a.executor.memory_limit) < a.executor.memory_limit / 50
        assert c.executor.kernel_memory()[1] == b.executor.kernel_memory()[1]


def test_duckdb_out_of_memory_inside_a_kernel_is_an_out_of_memory_error():
    """DuckDB's own out of memory while a kernel allocated its result came back as the kernel's internal
    error (DuckDB's exception as JSON) and read as a KernelError, "a block kernel rejected its input" (found
   : ``memory_limit="9MiB"``, 16 KiB blocks)."""
    text = (
        'Invalid Input Error: tensor_source: internal error: {"exception_type":"Out of Memory",'
        '"exception_message":"failed to allocate data of size 256.0 KiB (8.8 MiB/9.0 MiB used)"}'
    )
    err = duck_errors.wrap(duckdb.InvalidInputException(text), "einsum")
    assert isinstance(err, OutOfMemoryError) and isinstance(err, MemoryError)
    assert "failed to allocate data of size 256.0 KiB" in str(err) and "memory_limit" in str(err)
    with ts.connect(memory_limit="9MiB", max_block_bytes="16KiB") as s:
        x = np.random.default_rng(0).random((400, 300))
        try:
            got = s.einsum("ij,ij->", x, x, strategy="data").numpy()
        except OutOfMemoryError:
            pass  # as on this machine: never a KernelError
        else:
            assert_einsum_close(got, "ij,ij->", x, x)
