"""numpy compatibility of ts.einsum / einsum_path / contract_expression: sublists, order=, optimize=, numpy's
exception classes, out=, dtypes tensorsql declines (docs "Einsum and numpy compatibility"). numpy's and
opt_einsum's own suites run in tests/compat."""

from __future__ import annotations

import random

import numpy as np
import opt_einsum
import pytest
from tolerance import assert_einsum_close

import tensorsql as ts
from tensorsql.errors import (
    CastingError,
    ConfigError,
    EinsumPathError,
    EinsumTypeError,
    OutputError,
    UnknownStrategyError,
)

RNG = np.random.default_rng(13)
A = RNG.standard_normal((2, 3))
B = RNG.standard_normal((3, 4))
C = RNG.standard_normal((4, 2))


# --- sublists -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sublist",
    [np.array([0, 0]), np.array([0, 0], dtype=np.uint8), (0, 0), [np.int64(0), np.int32(0)], range(0, 1, 1)],
    ids=["int64-array", "uint8-array", "tuple", "numpy-ints", "range"],
)
def test_integer_array_and_sequence_sublists(sublist):
    x = RNG.standard_normal((3, 3)) if len(sublist) == 2 else RNG.standard_normal(3)
    got = ts.einsum(x, sublist)
    np.testing.assert_allclose(got, np.einsum(x, list(sublist)), rtol=0, atol=8 * np.finfo(float).eps)
    assert_einsum_close(
        ts.einsum(A, np.array([0, 1]), B, np.array([1, 2]), np.array([0, 2])), "ij,jk->ik", A, B
    )


def test_bytes_subscripts_like_numpy():
    assert_einsum_close(ts.einsum(b"ij,jk->ik", A, B), "ij,jk->ik", A, B)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 0), "sublist of operand 0 must be a list or tuple"),
        ((None,) * 63, "must be a list or tuple"),
        ((A, np.array([0.0, 1.0])), "1-d array of int labels"),
        ((A, [0, True]), "label True is not an int"),
        ((A, [0, 1.5]), "label 1.5 is not an int"),
        ((A, [0, 1], B), "output sublist must be a 1-d array"),
    ],
)
def test_bad_sublists_are_type_errors_like_numpy(args, match):
    with pytest.raises(TypeError):
        np.einsum(*args)
    with pytest.raises(EinsumTypeError, match=match) as info:
        ts.einsum(*args)
    assert isinstance(info.value, ts.EinsumError)  # still the einsum input error it was


# --- order= ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["c", "C", b"C", "f", "F", "a", "A", "k", "K", None])
def test_order_takes_numpy_spellings(order):
    fa, fb = np.asfortranarray(RNG.standard_normal((2, 3, 5))), np.asfortranarray(RNG.standard_normal((4, 3)))
    got = ts.einsum("...ft,mf->...mt", fa, fb, order=order)
    want = np.einsum("...ft,mf->...mt", fa, fb, order=order)
    assert_einsum_close(got, "...ft,mf->...mt", fa, fb)
    assert (got.flags.c_contiguous, got.flags.f_contiguous) == (
        want.flags.c_contiguous,
        want.flags.f_contiguous,
    )
    assert got.strides == want.strides


def test_order_a_is_f_only_when_every_operand_is_fortran():
    fa, c = np.asfortranarray(RNG.standard_normal((2, 3, 5))), RNG.standard_normal((4, 3))
    assert ts.einsum("...ft,mf->...mt", fa, np.asfortranarray(c), order="A").flags.f_contiguous
    assert ts.einsum("...ft,mf->...mt", fa, c, order="a").flags.c_contiguous


def _random_layout_case(rng: random.Random) -> tuple[str, list[np.ndarray]]:
    letters = "abcde"
    sizes = {x: rng.choice([1, 2, 3, 4]) for x in letters}
    terms = ["".join(rng.choice(letters) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 3))]
    used = sorted(set("".join(terms)))
    eq = ",".join(terms) + "->" + "".join(rng.sample(used, rng.randint(0, len(used))))
    arrays = []
    for term in terms:
        shape = [sizes[x] for x in term]
        if not shape:
            arrays.append(np.asarray(RNG.standard_normal()))
            continue
        base = RNG.standard_normal(tuple(n + 1 for n in shape))
        layout = rng.choice(["C", "F", "perm"])
        if layout == "F":
            base = np.asfortranarray(base)
        elif layout == "perm" and base.ndim:
            perm = rng.sample(range(base.ndim), base.ndim)
            base = np.ascontiguousarray(base.transpose(perm)).transpose(np.argsort(perm))
        arrays.append(base[tuple(slice(0, n) for n in shape)])  # a strided view
    return eq, arrays


def test_order_k_and_a_lay_out_the_result_as_numpy_does():
    """order='K' with operands that are not all C-contiguous is the axis order numpy's unoptimized einsum
    allocates (its nditer sorts the axes by the operands' strides); seeded random equations over F, permuted
    and strided operands."""
    rng = random.Random(13)
    checked = 0
    while checked < 60:
        eq, arrays = _random_layout_case(rng)
        order = rng.choice("KA")
        want = np.einsum(eq, *arrays, order=order)
        if np.ndim(want) < 2 or any(np.shares_memory(want, a) for a in arrays):  # numpy returned a view
            continue
        if order == "K" and all(a.flags.c_contiguous for a in arrays):  # the engine's layout (below)
            continue
        got = ts.einsum(eq, *arrays, order=order)
        assert_einsum_close(got, eq, *arrays)
        same = [g == w for g, w, n in zip(got.strides, want.strides, want.shape, strict=True) if n > 1]
        assert all(same), f"{eq} order={order}: strides {got.strides}, numpy's {want.strides}"
        checked += 1


def test_order_k_keeps_the_engines_layout_for_c_contiguous_operands():
    """No copy into numpy's layout when the operands carry no layout of their own (C order): a large output
    that interleaves the operands' labels stays the GEMM-ordered view the engine returned."""
    x = RNG.standard_normal((10, 10, 8, 10)).astype(np.float32)
    y = RNG.standard_normal((10, 10, 10, 8)).astype(np.float32)
    got = ts.einsum("bcgf,adeg->abcdef", x, y)
    assert not got.flags.c_contiguous and got.base is not None
    assert_einsum_close(got, "bcgf,adeg->abcdef", x, y)
    assert ts.einsum("bcgf,adeg->abcdef", x, y, order="C").flags.c_contiguous


def test_contract_expression_follows_order():
    expr = ts.contract_expression("ij,jk->ki", A.shape, B.shape, order="F")
    assert expr(A, B).flags.f_contiguous
    assert_einsum_close(expr(A, B), "ij,jk->ki", A, B)


# --- optimize= ------------------------------------------------------------------------------------------


def test_numpy_memory_limit_tuples():
    outer = [RNG.standard_normal(n) for n in (2, 3, 4)]
    for name in ("greedy", "optimal"):
        path, _ = ts.einsum_path("a,b,c->abc", *outer, optimize=(name, 0))
        assert (
            path == ["einsum_path", (0, 1, 2)] == np.einsum_path("a,b,c->abc", *outer, optimize=(name, 0))[0]
        )
        got = ts.einsum("a,b,c->abc", *outer, optimize=(name, 0))
        assert_einsum_close(got, "a,b,c->abc", *outer)
    path, _ = ts.einsum_path("ij,jk,kl->il", A, B, C, optimize=("optimal", 10**9))
    assert path == ["einsum_path", (1, 2), (0, 1)]
    assert_einsum_close(ts.einsum("ij,jk,kl->il", A, B, C, optimize=("greedy", 6)), "ij,jk,kl->il", A, B, C)


@pytest.mark.parametrize(
    "optimizer",
    [
        opt_einsum.RandomGreedy(max_repeats=4),
        opt_einsum.DynamicProgramming(),
        opt_einsum.BranchBound(),
    ],
    ids=["RandomGreedy", "DynamicProgramming", "BranchBound"],
)
def test_opt_einsum_path_optimizers_pass_through(optimizer):
    eq, ops = "ij,jk,kl,li->", [A, B, C, RNG.standard_normal((2, 2))]
    assert_einsum_close(ts.einsum(eq, *ops, optimize=optimizer), eq, *ops, optimize="greedy")
    path, _ = ts.einsum_path(eq, *ops, optimize=optimizer)
    assert path[0] == "einsum_path" and len(path) == 4
    assert_einsum_close(
        ts.contract_expression(eq, *[o.shape for o in ops], optimize=optimizer)(*ops), eq, *ops
    )


def test_optimize_false_is_one_step_like_numpy():
    ops = [RNG.standard_normal((2, 2)) for _ in range(4)]
    assert ts.einsum_path("ab,bc,cd,de->ae", *ops, optimize=False)[0] == ["einsum_path", (0, 1, 2, 3)]
    assert_einsum_close(ts.einsum("ab,bc,cd,de->ae", *ops, optimize=False), "ab,bc,cd,de->ae", *ops)


def test_einsum_path_report_uses_numpy_letters():
    _, text = ts.einsum_path(np.ones((1,) * 27), range(27))
    assert text.split("->")[-1].strip() == "ABCDEFGHIJKLMNOPQRSTUVWXYZa"


def test_contract_expression_takes_opt_einsum_forms():
    x, y, z = (RNG.standard_normal((2, 2)) for _ in "xyz")
    want = np.einsum(x, [0, 1], y, [1, 2], z, [2, 3], [3, 0])
    expr = ts.contract_expression((2, 2), [0, 1], (2, 2), [1, 2], (2, 2), [2, 3], [3, 0])
    assert_einsum_close(expr(x, y, z), x, [0, 1], y, [1, 2], z, [2, 3], [3, 0], want=want)
    expr = ts.contract_expression("ab,bc->ac", (2, 2), (2, 2), use_blas=False, memory_limit="max_input")
    assert_einsum_close(expr(x, y, backend="numpy"), "ab,bc->ac", x, y)
    with pytest.raises(TypeError, match="unexpected keyword"):
        expr(x, y, order="F")
    with pytest.raises(ConfigError, match="argument of the expression's call"):
        ts.contract_expression("ab,bc->ac", (2, 2), (2, 2), out=np.empty((2, 2)))


# --- numpy's exception classes --------------------------------------------------------------------------


def _ops(eq: str) -> list[np.ndarray]:
    sizes = dict(zip("abcde", (2, 3, 4, 5, 2), strict=True))
    return [np.ones([sizes[x] for x in t]) for t in eq.split("->")[0].split(",")]


@pytest.mark.parametrize(
    ("call", "builtin", "typed", "match"),
    [
        (lambda f: f(0, 0), TypeError, EinsumTypeError, "must be a list or tuple"),
        (lambda f: f("", 0, out="test"), TypeError, EinsumTypeError, "out= must be a numpy ndarray"),
        (lambda f: f("", 0, order="W"), ValueError, ConfigError, "order='W'"),
        (lambda f: f("", 0, order=1), TypeError, EinsumTypeError, "order must be a str"),
        (lambda f: f("", 0, casting="blah"), ValueError, CastingError, "casting='blah'"),
        (lambda f: f("", 0, dtype="bad_data_type"), TypeError, ts.DTypeError, "bad_data_type"),
        (lambda f: f("", 0, bad_arg=0), TypeError, TypeError, "bad_arg"),
        (
            lambda f: f(
                "ab,bc,cd,de->ae", *_ops("ab,bc,cd,de->ae"), optimize=["einsum_path", (2, 3), (0, 1)]
            ),
            RuntimeError,
            EinsumPathError,
            "leaves 2 operands uncontracted",
        ),
        (
            lambda f: f("a,a,a->a", *_ops("a,a,a->a"), optimize=["einsum_path", (1,), (0, 1)]),
            RuntimeError,
            EinsumPathError,
            "leaves 2 operands",
        ),
        (lambda f: f("ab,bc", *_ops("ab,bc"), optimize=False, casting=5), TypeError, CastingError, "5"),
        (lambda f: f("ab,bc,cd", *_ops("ab,bc,cd"), optimize="blah"), KeyError, UnknownStrategyError, "blah"),
        (lambda f: f("ab,bc,cd", *_ops("ab,bc,cd"), optimize=5), TypeError, EinsumTypeError, "optimize=5"),
        (
            lambda f: f("ab,bc,cd", *_ops("ab,bc,cd"), optimize=("greedy",)),
            TypeError,
            EinsumTypeError,
            "greedy",
        ),
        (
            lambda f: f("i->i", [[0, 1], [0, 1]], out=np.ones((2, 2))),
            ValueError,
            ts.EinsumError,
            "2 dimension",
        ),
    ],
)
def test_errors_have_numpys_builtin_class(call, builtin, typed, match):
    with pytest.raises(builtin):
        call(np.einsum)
    with pytest.raises(typed, match=match) as info:
        call(ts.einsum)
    assert isinstance(info.value, builtin)
    assert isinstance(info.value, ts.TensorSQLError) or typed is TypeError


def test_einsum_path_errors_have_numpys_builtin_class():
    ops = _ops("ab,bc,cd,de->ae")
    with pytest.raises(EinsumPathError):
        ts.einsum_path("ab,bc,cd,de->ae", *ops, optimize=["einsum_path", (2, 3), (0, 1)])
    with pytest.raises(EinsumTypeError):
        ts.einsum_path(0, 0)


def test_read_only_out_is_a_typed_value_error():
    out = np.empty((2, 4))
    out.flags.writeable = False
    with pytest.raises(ValueError):
        np.einsum("ij,jk->ik", A, B, out=out)
    with pytest.raises(OutputError, match=r"out= is read-only \(shape \(2, 4\), dtype float64\)"):
        ts.einsum("ij,jk->ik", A, B, out=out)
    with pytest.raises(OutputError, match="read-only"):
        ts.contract_expression("ij,jk->ik", A.shape, B.shape)(A, B, out=out)


# --- dtypes ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="longdouble is float64 on this platform")
@pytest.mark.parametrize(("dtype", "name"), [(np.longdouble, "longdouble"), (np.clongdouble, "clongdouble")])
def test_longdouble_is_refused_with_the_reason(dtype, name):
    x = np.arange(4, dtype=dtype)
    with pytest.raises(ts.DTypeError, match=rf"numpy's {name}, 64-bit mantissa\) cannot be computed exactly"):
        ts.einsum("i,i", x, x)
    with pytest.raises(ts.DTypeError, match=name):
        ts.einsum("i,i", A[0], A[0], dtype=dtype)
    got = ts.einsum(
        "i,i", x, x, dtype=np.complex128 if name == "clongdouble" else np.float64, casting="same_kind"
    )
    assert got == 14


def test_object_operands_with_dtype_are_converted_first():
    objects = np.arange(9, dtype=object)
    for dtype in ("f8", "i4", "c8", "u1"):
        got = ts.einsum("i->", objects, dtype=dtype, casting="unsafe")
        assert got == 36 and got.dtype == np.dtype(dtype)
    with pytest.raises(ts.DTypeError, match=r"operand 0 has dtype object.*pass dtype="):
        ts.einsum("i->", objects)
    with pytest.raises(ts.DTypeError, match="cannot be converted to float64"):
        ts.einsum("i->", np.array([1, "x"], dtype=object), dtype="f8", casting="unsafe")


def test_dtype_casts_the_operands_as_numpy_does():
    """dtype= casts each operand to it before computing: 0.5 is True as a bool (it was truncated to the int
    carrier's 0), and float16 rounds the inputs before the product."""
    a, b = np.array([0.5, 2.0, 0.0]), np.array([1.0, 0.25, 3.0])
    for dtype in ("?", "e", "i1"):
        got = ts.einsum("i,i->i", a, b, dtype=dtype, casting="unsafe")
        want = np.einsum("i,i->i", a, b, dtype=dtype, casting="unsafe")
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    x = np.array([1 + 2**-13, 3.0], dtype=np.float32)  # 1 + 2**-13 rounds to 1.0 in float16
    np.testing.assert_array_equal(
        ts.einsum("i,i->", x, x, dtype="e", casting="same_kind"),
        np.einsum("i,i->", x, x, dtype="e", casting="same_kind"),
    )


def test_contract_expression_casts_to_dtype_first_on_every_call():
    """``dtype=`` casts the operands first (numpy's truthiness, rounding) on the first call and every later
    one, also when the kernels compute in a wider carrier."""
    expr = ts.contract_expression("i,i->", (2,), (2,), dtype=bool, casting="unsafe")
    x, y = np.array([1, -1]), np.array([1, 1])
    want = np.einsum("i,i->", x, y, dtype=bool, casting="unsafe")
    assert [expr(x, y) for _ in range(3)] == [want] * 3
    half = ts.contract_expression("i,i->", (3,), (3,), dtype=np.float16, casting="same_kind")
    a = np.array([1.0001, 2.0002, 3.0003], np.float32)
    assert half(a, a) == np.einsum("i,i->", a, a, dtype=np.float16, casting="same_kind")


def test_a_non_finite_memory_limit_is_a_type_error():
    ops = [np.ones((2, 2))] * 3
    for limit in (float("inf"), float("nan")):
        with pytest.raises(ts.EinsumTypeError, match="memory limit must be a finite number"):
            ts.einsum("ij,jk,kl->il", *ops, optimize=("greedy", limit))


@pytest.mark.parametrize(
    "call",
    [
        lambda X, s: np.add(X, 1, out=X),
        lambda X, s: np.exp(np.ones(4), out=X),
        lambda X, s: np.negative(X, out=(X,)),
    ],
    ids=["add", "exp", "tuple"],
)
def test_a_ufunc_writing_into_a_relation_is_a_typed_error(call):
    """numpy handed such a call back to the relation again and again: the interpreter died of a segfault.
    (``np.add.reduce(a, out=X)`` raises the same error; numpy 2.5 then keeps a reference to ``X`` for good,
    so it is not called here, where the session would outlive the test.)"""
    with ts.connect() as s:
        X = s.from_numpy(np.arange(4.0))
        with pytest.raises(ts.OutputError, match="cannot be written into"):
            call(X, s)
        with pytest.raises(ts.OutputError, match="cannot be changed in place"):
            np.add.at(X, [0], 100.0)
        out = np.zeros(4)
        assert np.add(X, 1, out=out) is out  # a numpy out= still works
        np.testing.assert_array_equal(out, np.arange(4.0) + 1)


def test_einsum_over_a_relation_takes_casting_order_and_carried_dtypes_like_numpy():
    """A relation operand used to drop ``casting=`` (a float64 operand under ``dtype='int8',
    casting='unsafe'`` was refused) and ``order=`` (a bad value passed silently), and a bool or float16
    array beside a relation was refused though operators take them."""
    a = np.array([1.7, -1.2, 3.5])
    b = np.array([2.0, 3.0, -1.0], np.float32)
    with ts.connect() as s:
        X = s.from_numpy(a)
        got = ts.einsum("i,i->i", X, b, dtype="int8", casting="unsafe")
        want = np.einsum("i,i->i", a, b, dtype="int8", casting="unsafe")
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want)
        with pytest.raises(ts.CastingError, match="casting='blah'"):
            ts.einsum("i,i->i", X, b, casting="blah")
        with pytest.raises(ValueError, match="order='W'"):
            ts.einsum("i,i->i", X, b, order="W")
        with pytest.raises(ts.DTypeError, match="to the result dtype float64 with casting='no'"):
            ts.einsum("i,i->i", X, b, casting="no")
        for other in (np.array([True, False, True]), np.array([1.5, 2.5, -0.5], np.float16)):
            got, want = ts.einsum("i,i->i", X, other), np.einsum("i,i->i", a, other)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.numpy(), want)
        ints = s.from_numpy(np.array([3, 4, 5]))
        half = np.array([1.5, 2.5, -0.5], np.float16)
        got, want = ts.einsum("i,i->i", ints, half), np.einsum("i,i->i", np.array([3, 4, 5]), half)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want)


def test_a_float16_result_past_its_range_is_inf_without_a_warning(recwarn):
    """Computed in float32 and cast back: numpy's float16 sum overflows to inf silently, and so does this
    (the cast back warned 'overflow encountered in cast')."""
    x = np.array([65504, 65504], np.float16)
    got = ts.einsum("i->", x)
    assert got == np.einsum("i->", x) == np.inf and got.dtype == np.float16
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_bool_operand_too_big_to_copy_is_an_out_of_memory_error():
    """The message's size used the operand's own dtype, which for bool is no tensor dtype: a DTypeError."""
    with ts.connect() as s, pytest.raises(ts.OutOfMemoryError, match=r"operand 1 .*GiB"):
        s.einsum("i,i->i", s.from_numpy(np.ones(1)), np.broadcast_to(np.array(True), (2**41,)))
