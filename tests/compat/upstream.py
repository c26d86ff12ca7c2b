"""Run numpy's and opt_einsum's own einsum tests, from the installed packages, against tensorsql.

The test files are never copied into this repository: each is executed from the installed package as a fresh
module whose einsum entry points are tensorsql's. Every call made through them is also made with the real
numpy/opt_einsum function on copies of the same arguments, and the two results are compared (dtype, shape,
value: integers exactly, floats within ``tolerance.einsum_tolerance``), so a wrong value fails the test even
where the upstream test only compares tensorsql with itself (``optimize=False`` against ``optimize=True``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import opt_einsum
import pytest
from tolerance import assert_close, einsum_tolerance

import tensorsql as ts

#: calls compared with the real function, and how many of those returned a different result
STATS = {"compared": 0, "mismatched": 0}

_REAL_NP_EINSUM = np.einsum
_REAL_NP_EINSUM_PATH = np.einsum_path
_REAL_CONTRACT = opt_einsum.contract


def numpy_test_file() -> Path | None:
    """numpy's ``test_einsum.py`` (numpy 2: ``numpy/_core/tests``; numpy 1: ``numpy/core/tests``)."""
    root = Path(np.__file__).parent
    for rel in ("_core/tests/test_einsum.py", "core/tests/test_einsum.py"):
        if (root / rel).is_file():
            return root / rel
    return None


def opt_einsum_test_file(name: str) -> Path | None:
    path = Path(opt_einsum.__file__).parent / "tests" / name
    return path if path.is_file() else None


def _snapshot(value: object) -> object:
    """A copy of an array argument (an ``out=`` may overwrite an operand), anything else as it is."""
    return value.copy(order="K") if isinstance(value, np.ndarray) else value


def _operand_args(args: tuple[object, ...]) -> list[object]:
    """The positional arguments with every operand made an ndarray (for the tolerance's parser)."""
    if args and isinstance(args[0], str | bytes):
        return [args[0], *(np.asarray(a) for a in args[1:])]
    return [np.asarray(a) if i % 2 == 0 and i < len(args) - len(args) % 2 else a for i, a in enumerate(args)]


def _compare(
    got: object, want: object, args: tuple[object, ...], kwargs: dict[str, object], scalar_type: bool
) -> None:
    STATS["compared"] += 1
    try:
        if scalar_type:
            assert isinstance(got, np.ndarray) == isinstance(want, np.ndarray), (
                f"returned {type(got).__name__}, the reference returned {type(want).__name__}"
            )
        g, w = np.asarray(got), np.asarray(want)
        assert g.dtype == w.dtype, f"result dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"result shape {g.shape} != {w.shape}"
        if g.dtype.kind not in "fc":
            np.testing.assert_array_equal(g, w)
            return
        # the computation's dtype (dtype=, else numpy's result type) or the result's (out=), the coarser
        ops = _operand_args(args)
        arrays = [o for o in ops if isinstance(o, np.ndarray)]
        computed = kwargs.get("dtype")
        computed = np.result_type(*arrays) if computed is None else computed
        coarse = max((np.dtype(computed), g.dtype), key=lambda d: np.finfo(d).eps if d.kind in "fc" else 0.0)
        assert_close(g, w, einsum_tolerance(*ops, dtype=coarse))
    except AssertionError as exc:
        STATS["mismatched"] += 1
        raise AssertionError(
            f"{exc}\n(tensorsql differs from the real function on {args!r:.300}, {kwargs})"
        ) from exc


def cross_checked(
    fn: Callable[..., object], real: Callable[..., object], scalar_type: Callable[[dict[str, object]], bool]
) -> Callable[..., object]:
    """``fn``, with each successful call compared against ``real`` on copies of the same arguments (calls
    the real function rejects, e.g. more than 52 labels for numpy, are not compared). ``scalar_type(kwargs)``:
    must the call's 0-d result type (numpy scalar or 0-d ndarray) match too?"""

    def call(*args: object, **kwargs: object) -> object:
        snap_args = tuple(_snapshot(a) for a in args)
        snap_kwargs = {k: _snapshot(v) for k, v in kwargs.items()}
        got = fn(*args, **kwargs)
        try:
            want = real(*snap_args, **snap_kwargs)
        except Exception:
            return got
        _compare(got, want, snap_args, snap_kwargs, scalar_type(kwargs))
        return got

    call.__name__ = getattr(real, "__name__", "einsum")
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


@contextmanager
def _patched(patches: list[tuple[object, str, object]]) -> Iterator[None]:
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def _exec(path: Path, name: str, patches: list[tuple[object, str, object]]) -> types.ModuleType:
    """Execute ``path`` as a new module ``name`` with ``patches`` applied while it runs: its import-time
    references (``from opt_einsum import contract``, parametrize values like ``np.einsum``) bind to them."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with _patched(patches):
        spec.loader.exec_module(module)
    return module


def _tests_of(module: types.ModuleType) -> dict[str, object]:
    """The module's test functions and classes (what pytest collects), for the stub module's namespace."""
    return {
        k: v
        for k, v in vars(module).items()
        if (k.startswith("test") and isinstance(v, types.FunctionType))
        or (k.startswith("Test") and isinstance(v, type))
    }


class _NumpyWithTensorsqlEinsum(types.ModuleType):
    """``numpy`` as the upstream test module sees it: everything numpy's, except einsum and einsum_path."""

    def __getattr__(self, name: str) -> object:
        return getattr(np, name)


def numpy_suite() -> dict[str, object]:
    """numpy's test_einsum.py with np.einsum -> ts.einsum and np.einsum_path -> ts.einsum_path."""
    path = numpy_test_file()
    if path is None:
        pytest.skip(f"numpy {np.__version__} does not ship tests/test_einsum.py", allow_module_level=True)
    # numpy's unoptimized einsum returns a numpy scalar for a 0-d result, as tensorsql always does; its
    # optimized path returns a 0-d ndarray or a scalar depending on which internal routine ran last
    einsum = cross_checked(ts.einsum, _REAL_NP_EINSUM, lambda kw: kw.get("optimize", False) is False)
    proxy = _NumpyWithTensorsqlEinsum("numpy")
    proxy.einsum = einsum  # type: ignore[attr-defined]
    proxy.einsum_path = ts.einsum_path  # type: ignore[attr-defined]
    module = _exec(
        path, "_upstream_numpy_test_einsum", [(np, "einsum", einsum), (np, "einsum_path", ts.einsum_path)]
    )
    module.np = proxy  # the tests look numpy up at run time: through the proxy, never numpy itself patched
    return _tests_of(module)


_OPT_EINSUM_ONLY = ("use_blas", "memory_limit", "backend")


def contract(*operands: object, **kwargs: object) -> object:
    """opt_einsum.contract's signature on ts.einsum: numpy's keywords pass through; ``use_blas`` is
    opt_einsum's kernel choice (tensorsql has its own), ``memory_limit`` joins ``optimize`` as numpy's
    (name, limit)."""
    opt = {k: kwargs.pop(k) for k in _OPT_EINSUM_ONLY if k in kwargs}
    if opt.get("backend", "auto") not in ("auto", "numpy"):
        raise ValueError(f"backend={opt['backend']!r}: tensorsql computes with its own engine")
    optimize = kwargs.pop("optimize", True)
    if opt.get("memory_limit") is not None:
        optimize = ("greedy" if optimize is True else optimize, opt["memory_limit"])
    return ts.einsum(*operands, optimize=optimize, **kwargs)


def opt_einsum_suite(filename: str) -> dict[str, object]:
    """opt_einsum's tests/<filename> with contract -> ts.einsum (cross-checked) and contract_expression ->
    ts.contract_expression; numpy stays numpy (test_drop_in_replacement compares with the real np.einsum)."""
    path = opt_einsum_test_file(filename)
    if path is None:
        pytest.skip(
            f"opt_einsum {opt_einsum.__version__} does not ship tests/{filename}", allow_module_level=True
        )
    patches = [
        (opt_einsum, "contract", cross_checked(contract, _REAL_CONTRACT, lambda kw: False)),
        (opt_einsum, "contract_expression", ts.contract_expression),
    ]
    return _tests_of(_exec(path, f"_upstream_opt_einsum_{path.stem}", patches))
