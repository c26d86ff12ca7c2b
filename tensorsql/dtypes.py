"""The dtypes a tensor relation may hold, and how other numpy dtypes are carried through them."""

from __future__ import annotations

import numpy as np

from tensorsql.errors import DTypeError

#: dtype name -> little-endian numpy dtype. These are the names the kernels understand: every integer type is
#: computed in itself (uint64 above 2**63, max/min, relu, abs and conversions need the real type, not the bits
#: of a wider signed one).
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "complex64": np.dtype("<c8"),
    "complex128": np.dtype("<c16"),
    "int8": np.dtype("i1"),
    "int16": np.dtype("<i2"),
    "uint8": np.dtype("u1"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "uint64": np.dtype("<u8"),
}

# numpy dtypes the drop-in ``tensorsql.einsum`` accepts by computing in a wider relation dtype and casting
# back: bool einsum is OR-of-AND, i.e. ``!= 0`` of the integer result (int64: a count of true products cannot
# wrap to 0); float16 is computed in float32 and rounded once at the end.
_CARRIERS: dict[str, str] = {
    "bool": "int64",
    "float16": "float32",
}
#: the numpy dtypes no tensor has, carried in another (``carrier_dtype``)
CARRIED = frozenset(_CARRIERS)


def dtype_name(dtype: object) -> str:
    """Canonical relation dtype name for anything numpy accepts as a dtype; raises on the rest."""
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise DTypeError(f"unknown dtype {dtype!r}; supported: {', '.join(DTYPES)}") from exc
    name = dt.name
    if name not in DTYPES:
        raise DTypeError(f"dtype {name} is not a tensor relation dtype; supported: {', '.join(DTYPES)}")
    return name


_CARRIER_OF: dict[np.dtype, str] = {}


def carrier_dtype(dtype: np.dtype) -> str:
    """The relation dtype that carries a numpy dtype through the engine (itself when supported)."""
    if isinstance(dtype, np.dtype):
        found = _CARRIER_OF.get(dtype)
        if found is None:
            found = _CARRIER_OF[dtype] = _carrier(dtype.name)
        return found
    return _carrier(np.dtype(dtype).name)


def _carrier(name: str) -> str:
    if name in DTYPES:
        return name
    if name in _CARRIERS:
        return _CARRIERS[name]
    raise DTypeError(f"dtype {name} cannot be computed by tensorsql; supported: {', '.join(DTYPES)}")


def is_complex(name: str) -> bool:
    return name.startswith("complex")


def is_integer(name: str) -> bool:
    return name.startswith(("int", "uint"))


def promote_float(name: str) -> str:
    """The dtype a float-valued function (exp, log, divide...) of ``name`` produces, as in numpy."""
    return "float64" if is_integer(name) else name


def itemsize(name: str) -> int:
    return DTYPES[name].itemsize
