"""Float tolerances derived from the computation (docs "Tests").

A float result is compared element by element with a tolerance bounded by the rounding error of the
computation that produced it, never with ``rtol`` alone: a sum of products that cancels to near zero errs in
proportion to the magnitude of its terms, not of its result, and which BLAS, kernel path or summation order
produced it changes those low bits (OpenBLAS on an AVX2 machine, the packed AVX-512 kernel, the generic loop
and block-wise partial sums all sum in different orders).

For an einsum, every output element is a sum of products of operand elements. Whatever order the sum is taken
in, a term that goes through m rounded operations is off by a relative gamma_m ~ m·u (u = eps/2, Higham), so

    |got - exact| <= m·u · einsum(|operands|)

with m <= K + 2n: K the number of products each output element sums (the product of the sizes of the summed
labels, the worst order; or, for a known pairwise path, the sum over its steps of the products each step
sums) and n the operands (a multiplication each, and a pairwise path's steps one more rounding each at most).
The tolerance, :func:`einsum_tolerance`, (K + 2n + 2)·eps, is twice that (eps rather than u: it also covers a
reference computed at the same precision) plus two roundings for complex products and the final cast.
Integers compare exactly.

Elementwise functions and reductions other than sums have their own rules (:func:`elementwise_tolerance`,
:func:`reduction_tolerance`); composite pipelines (softmax, attention) build theirs from these in the test.
"""

from __future__ import annotations

import math

import numpy as np
import opt_einsum
from opt_einsum.parser import parse_einsum_input

__all__ = [
    "assert_close",
    "assert_einsum_close",
    "einsum_reference",
    "einsum_tolerance",
    "elementwise_tolerance",
    "eps",
    "magnitude",
    "reduction_tolerance",
    "summed_terms",
]


def eps(dtype) -> float:
    """Machine epsilon of a float or complex dtype (of its real part); 0.0 for integers and bool."""
    dt = np.dtype(dtype)
    return float(np.finfo(dt).eps) if dt.kind in "fc" else 0.0


def _tiny(dtype) -> float:
    dt = np.dtype(dtype)
    return float(np.finfo(dt).tiny) if dt.kind in "fc" else 0.0


def _parse(args) -> tuple[list[str], str, list[np.ndarray], dict[str, int]]:
    """(input terms, output term, operands, label sizes) of einsum arguments in numpy's string or interleaved
    form, with ``...`` expanded; a label's size is its size in any operand where it is not 1 (broadcast)."""
    inp, out, ops = parse_einsum_input(list(args))
    ops = [np.asarray(o) for o in ops]
    terms = inp.split(",")
    sizes: dict[str, int] = {}
    for term, op in zip(terms, ops, strict=True):
        for label, n in zip(term, op.shape, strict=True):
            if n != 1 or label not in sizes:
                sizes[label] = int(n)
    return terms, out, ops, sizes


def _contract(eq: str, *ops) -> np.ndarray:
    """opt_einsum's contract (pairwise, any number of labels), or numpy's einsum for what it declines."""
    try:
        return np.asarray(opt_einsum.contract(eq, *ops))
    except ValueError:
        return np.asarray(np.einsum(eq, *ops, optimize=True))


def _result_dtype(ops, dtype) -> np.dtype:
    return np.dtype(dtype) if dtype is not None else np.result_type(*ops)


def summed_terms(*args, optimize=None) -> int:
    """How many products an output element sums, as roundings of one term.

    Without ``optimize``: K, the product of the sizes of the summed labels (a bound for any summation order).
    With ``optimize`` (an opt_einsum strategy name or a pairwise path, as numpy and tensorsql take it): the
    sum over that path's steps of the products each step sums, for results computed along that path.
    """
    terms, out, _, sizes = _parse(args)
    summed = set("".join(terms)) - set(out)
    if optimize is None or len(terms) < 2:
        return math.prod(sizes[label] for label in summed)
    if isinstance(optimize, list | tuple) and optimize and optimize[0] == "einsum_path":
        optimize = list(optimize[1:])
    eq = ",".join(terms) + "->" + out
    shapes = [tuple(sizes[label] for label in t) for t in terms]
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=optimize)
    return sum(math.prod(sizes[label] for label in step[1]) for step in info.contraction_list)


def magnitude(*args) -> np.ndarray:
    """The einsum over the operands' absolute values, in float64: per output element, the sum of |term|."""
    terms, out, ops, _ = _parse(args)
    eq = ",".join(terms) + "->" + out
    return _contract(eq, *[np.abs(o).astype(np.float64) for o in ops])


def einsum_tolerance(*args, dtype=None, optimize=None) -> np.ndarray:
    """Per-element tolerance of a float einsum result, (K + 2n + 2)·eps(dtype)·einsum(|operands|) (see above).

    ``dtype``: the result's dtype (default: numpy's result type of the operands); ``optimize``: see
    :func:`summed_terms`."""
    _, _, ops, _ = _parse(args)
    dt = _result_dtype(ops, dtype)
    k = summed_terms(*args, optimize=optimize)
    return (k + 2 * len(ops) + 2) * eps(dt) * magnitude(*args) + _tiny(dt)


def einsum_reference(*args, dtype=None) -> np.ndarray:
    """The einsum at reference precision: float64 (complex128 for complex results); integers as numpy does."""
    terms, out, ops, _ = _parse(args)
    dt = _result_dtype(ops, dtype)
    eq = ",".join(terms) + "->" + out
    if dt.kind not in "fc":
        return _contract(eq, *ops).astype(dt)
    wide = np.complex128 if dt.kind == "c" else np.float64
    return _contract(eq, *[o.astype(wide) for o in ops])


def assert_close(got, want, tol, what: str = "") -> None:
    """|got - want| <= tol element by element (tol broadcasts); equal infinities and NaNs in both agree."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}shape {got.shape} != {want.shape}"
    wide = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else np.float64
    g, w = got.astype(wide, copy=False), want.astype(wide, copy=False)
    with np.errstate(invalid="ignore"):
        err = np.abs(g - w)
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), err.shape)
    bad = ~(err <= tol)
    if bad.any():  # equal infinities and NaNs in both agree
        bad &= ~((g == w) | (np.isnan(g) & np.isnan(w)))
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        ratio = np.max(np.where(bad, err / np.maximum(tol, np.finfo(np.float64).tiny), 0))
        raise AssertionError(
            f"{what}{int(bad.sum())} of {bad.size} elements differ beyond the tolerance (worst err/tol "
            f"{ratio:.3g}); first at {list(first)}: got {got[first]!r}, want {want[first]!r}, "
            f"err {err[first]:.3g} > tol {tol[first]:.3g}"
        )


def assert_einsum_close(got, *args, want=None, dtype=None, optimize=None) -> None:
    """``got`` equals the einsum of ``args`` (numpy's string or interleaved form): integers exactly, floats
    within :func:`einsum_tolerance`. ``want``: the caller's reference (default :func:`einsum_reference`);
    ``dtype``: the result's dtype (default numpy's result type); ``optimize``: see :func:`summed_terms`."""
    _, _, ops, _ = _parse(args)
    dt = _result_dtype(ops, dtype)
    if want is None:
        want = einsum_reference(*args, dtype=dt)
    if dt.kind not in "fc":
        np.testing.assert_array_equal(got, want)
        return
    assert_close(got, want, einsum_tolerance(*args, dtype=dt, optimize=optimize))


def elementwise_tolerance(want, dtype, roundings: int = 2) -> np.ndarray:
    """Tolerance of an elementwise function of exact inputs (a map, a cast, a single division or product):
    each element is one rounded library result with no sum that could cancel, so it errs in proportion to its
    own magnitude: (roundings + 2)·eps·|want| (``roundings`` per side: a libm function is within an ulp or
    two of the exact value on either side)."""
    return (roundings + 2) * eps(dtype) * np.abs(np.asarray(want)) + _tiny(dtype)


def reduction_tolerance(terms, agg: str, axis, dtype, roundings: int = 1) -> np.ndarray:
    """Tolerance of ``agg`` over ``axis`` of ``terms`` (reference values; each computed with ``roundings``
    rounded operations from exact inputs, e.g. a join of two operands), with K terms per result:

    - sum: the einsum rule, (K + roundings + 2)·eps·Σ|t|;
    - max/min: the result is one of the terms, (roundings + 1)·eps·max|t|;
    - prod: no cancellation, K·(roundings + 1)·eps·|Π t| (relative, a product of relative errors).
    """
    t = np.abs(np.asarray(terms)).astype(np.float64)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    k = math.prod(t.shape[a] for a in axes)
    e, tiny = eps(dtype), _tiny(dtype)
    if k == 0:  # an empty reduction gives its identity exactly
        return np.full(np.sum(t, axis=axes).shape, tiny)
    if agg == "sum":
        return (k + roundings + 2) * e * t.sum(axis=axes) + tiny
    if agg in ("max", "min"):
        return (roundings + 1) * e * t.max(axis=axes) + tiny
    if agg == "prod":
        return (k * (roundings + 1) + 1) * e * t.prod(axis=axes) + tiny
    raise ValueError(f"unknown agg {agg!r}")
