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
