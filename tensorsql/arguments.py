"""A user's arguments checked where they come in (arrays, shapes, flags), each refusal a typed error that
names the call: every maker of relations checks them the same way."""

from __future__ import annotations

import operator

import numpy as np

from tensorsql.errors import ConfigError, ShapeError

#: the largest dimension a shape may give (block keys and element offsets are int64)
MAX_DIMENSION = 2**62


def as_array(value: object, what: str) -> np.ndarray:
    """np.asarray with numpy's complaints about ragged or odd input turned into tensorsql errors."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ShapeError(f"{what}: cannot make an array of {type(value).__name__}: {exc}") from exc


def checked_shape(shape: object, what: str) -> tuple[int, ...]:
    """A user's shape as a tuple of non-negative ints, or a ShapeError naming the call."""
    try:
        given = tuple(shape)  # type: ignore[call-overload]  # once: a generator would be empty the next time
        if any(isinstance(n, bool | np.bool_) for n in given):
            raise TypeError("a bool is not a size")
        shp = tuple(operator.index(n) for n in given)
    except TypeError as exc:
        raise ShapeError(f"{what}: shape={shape!r} is not a sequence of ints") from exc
    if any(n < 0 for n in shp):
        raise ShapeError(f"{what}: shape {shp} has a negative dimension")
    if any(n > MAX_DIMENSION for n in shp):  # 10**20 reached DuckDB as a HUGEINT: its Binder Error
        raise ShapeError(f"{what}: shape {shp} has a dimension past 2**62 elements")
    return shp


def check_flag(value: object, what: str, name: str) -> None:
    """A boolean option is a bool (a str like "no" would be true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{what}: {name}= must be a bool, got {type(value).__name__}")
