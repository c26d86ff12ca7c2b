"""Every bad input a user can make ends in a typed TensorSQLError naming what is wrong."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import tensorsql as ts

A = np.ones((2, 3))
B = np.ones((3, 4))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("ij,jk->ik", A), "name 2 operand"),
        (("ij,jk->ik", A, B, B), "name 2 operand"),
        (("ij,jk->ik", A, np.ones((5, 4))), r"label 'j' has size 5 in operand 1 but size 3"),
        (("ijk,jk->ik", A, B), "operand 0 has 2 dimension"),
        (("ij,jk->iz", A, B), "output label 'z' does not appear"),
        (("ij,jk->iik", A, B), "output subscripts repeat"),
        (("ij,j1->i", A, B), "invalid subscript '1'"),
        (("i.j,jk", A, B), "not part of an ellipsis"),
        (("ij->->i", A), "more than one '->'"),
        (("...ij,jk->ik", np.ones((2, 2, 3)), B), "no '...'"),
        (("ii->i", np.ones((2, 3))), r"repeats label 'i' on dimensions of different sizes \(2 != 3\)"),
        (("ij",), r"name 1 operand\(s\) but 0 were given"),
        ((A, [0, -1]), "negative"),
        ((A, [0, "x"]), "not an int"),
    ],
)
def test_einsum_errors(args, match):
    with pytest.raises(ts.EinsumError, match=match):
        ts.einsum(*args)


def test_errors_are_builtin_subclasses():
    with pytest.raises(ValueError):
        ts.einsum("ij,jk", A)
    assert issubclass(ts.TableNotFoundError, KeyError)
    assert issubclass(ts.DTypeError, TypeError)


def test_bad_join_agg_map():
    with pytest.raises(ts.OperatorError, match=r"unknown join 'times'.*multiply"):
        ts.einsum("ij,jk", A, B, join="times")
    with pytest.raises(ts.OperatorError, match="unknown agg 'mean'"):
        ts.einsum("ij,jk", A, B, agg="mean")
    with pytest.raises(ts.OperatorError, match="one or two operands"):
        ts.einsum("ij,jk,kl", A, B, B.T, join="add")
    with pytest.raises(ts.OperatorError, match="unknown map function 'tanhh'"):
        ts.map(A, "tanhh")
    with pytest.raises(ts.OperatorError, match="needs a param"):
        ts.map(A, "pow")
    with pytest.raises(ts.DTypeError, match="complex"):
        ts.einsum("ij,jk", A.astype(complex), B, agg="max")
    with pytest.raises(ts.EinsumError, match="optimize"):
        ts.einsum("ij,jk,kl", A, B, B.T, optimize="no-such-strategy")
    with pytest.raises(ts.EinsumError, match="path step"):
        ts.einsum("ij,jk,kl", A, B, B.T, optimize=[(0, 7), (0, 1)])


def test_bad_dtypes(s):
    with pytest.raises(ts.DTypeError, match="not a tensor relation dtype"):
        s.from_numpy(np.ones(3, dtype=np.float16))
    with pytest.raises(ts.DTypeError, match="object"):
        ts.einsum("i,i", np.array([1, "a"], dtype=object), np.ones(2))
    with pytest.raises(ts.DTypeError, match=r"cannot be cast to dtype=float32 with casting=.safe."):
        ts.einsum("i,i", np.ones(3), np.ones(3), dtype=np.float32)
    with pytest.raises(ts.DTypeError, match="unknown dtype"):
        s.from_sql("SELECT 0, 1.0", shape=(1,), dtype="float99")


def test_bad_blocking(s):
    with pytest.raises(
        ts.ShapeError, match=r"block_shape=\(2,\) has 1 entries but the tensor has shape \(2, 3\)"
    ):
        s.from_numpy(A, block_shape=(2,))
    with pytest.raises(ts.ShapeError, match=r"block_shape\[1\]=0 must be >= 1"):
        s.from_numpy(A, block_shape=(2, 0))
    with pytest.raises(ts.ShapeError, match="not both"):
        s.from_numpy(A, block_shape=(1, 1), blocks=(1, 1))
    with pytest.raises(ts.ShapeError, match=r"blocks\[0\]=5 parts exceed"):
        s.from_numpy(A, blocks=(5, 1))


def test_missing_tables(s, tmp_path):
    with pytest.raises(ts.TableNotFoundError, match="no tensorsql catalog"):
        s.table("nope")
    s.from_numpy(A).save("present")
    with pytest.raises(ts.TableNotFoundError, match=r"no tensor relation 'nope'.*present"):
        s.table("nope")
    with pytest.raises(KeyError):
        s.table("nope")


def test_not_a_tensorsql_database(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ts.CatalogError, match="cannot open"):
        ts.connect(str(junk))
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE tensorsql_catalog (x INTEGER)")
    con.close()
    with ts.connect(str(other)) as s2, pytest.raises(ts.CatalogError, match="not a tensorsql catalog"):
        s2.table("anything")


def test_corrupted_blob_is_a_kernel_error(s):
    s.from_numpy(np.ones((2, 2)), block_shape=(2, 2)).save("corrupt")
    s.executor.con.execute("UPDATE corrupt SET tensor = '\\x00\\x01'::BLOB")
    rel = s.table("corrupt")
    with pytest.raises(ts.KernelError, match="bytes"):
        s.einsum("ij,jk->ik", rel, rel).numpy()
    with pytest.raises(ts.KernelError, match="bytes"):
        rel.numpy()


def test_truncated_blob_in_unary_and_map(s):
    s.from_numpy(np.ones((3, 3)), block_shape=(3, 3)).save("trunc")
    s.executor.con.execute("UPDATE trunc SET tensor = tensor[1:20]")
    rel = s.table("trunc")
    with pytest.raises(ts.KernelError):
        s.einsum("ij->j", rel).numpy()
    with pytest.raises(ts.KernelError):
        s.einsum("ij->ji", rel).reblock((2, 2)).numpy()


def test_softmax_bad_axis():
    with pytest.raises(ts.ShapeError, match="axis 3 is out of range"):
        ts.softmax(A, over=3)


def test_bad_table_name(s):
    with pytest.raises(ts.CatalogError, match="reserved"):
        s.from_numpy(A).save("tensorsql_catalog")
    with pytest.raises(ts.CatalogError, match="non-empty"):
        s.from_numpy(A).save("")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda s: ts.connect(threads=0), ts.ConfigError, "threads=0"),
        (lambda s: ts.connect(threads="2"), ts.ConfigError, "threads='2'"),
        (lambda s: s.from_sql("SELECT 1, 2.0", shape="ab"), ts.ShapeError, "not a sequence of ints"),
        (lambda s: s.from_sql("selec 1", shape=(2,)), ts.SQLExecutionError, "cannot parse"),
        (
            lambda s: s.from_sql("CREATE TABLE zz (a INT)", shape=(2,)),
            ts.SQLExecutionError,
            "must be a SELECT",
        ),
        (lambda s: s.from_numpy([[1, 2], [3]]), ts.ShapeError, "cannot make an array"),
        (lambda s: s.from_numpy(np.array(["a"])), ts.DTypeError, "str"),
        (lambda s: ts.map(A, "pow", "a"), ts.OperatorError, "not a number"),
        (lambda s: s.from_numpy(A, block_shape=(1.5, 2)), ts.ShapeError, "not a sequence of ints"),
        (lambda s: ts.einsum("ij", A, dtype="float99"), ts.DTypeError, "float99"),
        (lambda s: ts.connect("/nonexistent/dir/x.duckdb"), ts.CatalogError, "cannot open"),
        (lambda s: ts.connect().einsum("ij->j", s.from_numpy(A)), ts.ShapeError, "another session"),
        (lambda s: s.einsum("ij->i", A, blocks=[1]), ts.ShapeError, "dict label"),
    ],
)
def test_bad_calls_are_typed(s, call, error, match):
    with pytest.raises(error, match=match):
        call(s)


def test_save_existing_name_needs_replace(s):
    s.from_numpy(A).save("twice")
    with pytest.raises(ts.CatalogError, match="already exists"):
        s.from_numpy(A).save("twice")
