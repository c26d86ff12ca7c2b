"""numpy's form of each join and aggregation of the extended EinSum (a join on broadcast operands, an
aggregation over axes): the references the property and hardening tests compare with."""

from __future__ import annotations

import numpy as np

JOIN_REF = {
    "multiply": np.multiply,
    "add": np.add,
    "subtract": np.subtract,
    "divide": lambda x, y: np.true_divide(x.astype(np.float64), y.astype(np.float64)),
    "sqdiff": lambda x, y: np.subtract(x, y) * np.subtract(x, y),
    "absdiff": lambda x, y: np.abs(np.subtract(x, y)),
    "max": np.maximum,
    "min": np.minimum,
    **{
        name: (lambda f: lambda x, y: f(x, y).astype(np.result_type(x, y)))(getattr(np, name))
        for name in ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal")
    },
}
AGG_REF = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "biu":  # numpy's float result dtype for x first (-x of an unsigned int wraps)
        x = x.astype(np.exp(x[:0]).dtype)
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


#: numpy's form of each map (the param as a Python int when integral: ops.map_param)
MAP_REF = {
    "exp": lambda x, p: np.exp(x),
    "log": lambda x, p: np.log(x),
    "sqrt": lambda x, p: np.sqrt(x),
    "relu": lambda x, p: np.maximum(x, 0),
    "neg": lambda x, p: np.negative(x),
    "abs": lambda x, p: np.abs(x),
    "pow": lambda x, p: np.power(x, p),
    "scale": lambda x, p: np.multiply(x, p),
    "square": lambda x, p: np.multiply(x, x),
    "reciprocal": lambda x, p: np.true_divide(1, x),
    "sigmoid": lambda x, p: _sigmoid(x),
    "tanh": lambda x, p: np.tanh(x),
    "softplus": lambda x, p: np.logaddexp(np.zeros((), x.dtype), x),  # bool -> float16, as exp
    "rpow": lambda x, p: np.power(float(p), x),  # a weak Python float: x32 stays float32
}
