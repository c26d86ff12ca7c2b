"""The torch programs tensorsql's models are measured and checked against: the same functions, written with
torch's own operators, so a benchmark times equal work and a test compares equal results.

torch is optional (its wheel is large): ``make test-torch`` and ``make bench`` install it; everything here
imports it on first use and raises an ImportError that says how to get it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def torch() -> Any:
    try:
        import torch as t
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "torch is not installed; `make test-torch` or `make bench` installs the CPU build "
            "(pip install 'tensorsql[torch]')"
        ) from exc
    return t


def tensors(arrays: dict[str, np.ndarray], grad: bool = False) -> dict[str, Any]:
    """numpy arrays as torch tensors (copies), leaves that take gradients when ``grad``."""
    t = torch()
    return {k: t.tensor(np.array(v), requires_grad=grad) for k, v in arrays.items()}


def mlp_logits(params: dict[str, Any], x: Any, depth: int, activation: str = "relu") -> Any:
    """``ml.MLP.forward``: ``h = act(h @ W_i + b_i)``, no activation after the last layer (W is in x out)."""
    t = torch()
    act = {"relu": t.relu, "tanh": t.tanh, "sigmoid": t.sigmoid}[activation]
    h = x
    for i in range(depth):
        h = h @ params[f"W{i}"] + params[f"b{i}"]
        if i < depth - 1:
            h = act(h)
    return h


def mlp_loss(params: dict[str, Any], x: Any, labels: Any, depth: int, activation: str = "relu") -> Any:
    """``ml.MLP.loss`` for a classifier: mean softmax cross-entropy of the logits against class ids."""
    t = torch()
    return t.nn.functional.cross_entropy(mlp_logits(params, x, depth, activation), labels)


def rmsnorm(x: Any, g: Any, eps: float = 1e-6) -> Any:
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * g


def transformer_out(params: dict[str, Any], x: Any, heads: int, causal: bool = True) -> Any:
    """``ml.TransformerBlock.forward`` on one sequence ``x`` (seq, model): pre-norm (RMSNorm) multi-head
    attention with weights ``Wq/Wk/Wv`` (model, heads, e) and ``Wo`` (heads, e, model), then a ReLU MLP."""
    t = torch()
    p = params
    n = rmsnorm(x, p["g1"])
    q = t.einsum("sd,dhe->hse", n, p["Wq"])
    k = t.einsum("sd,dhe->hse", n, p["Wk"])
    v = t.einsum("sd,dhe->hse", n, p["Wv"])
    attended = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    h = t.einsum("hse,hed->sd", attended, p["Wo"]) + x
    m = rmsnorm(h, p["g2"])
    return t.relu(m @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"] + h


def transformer_loss(params: dict[str, Any], x: Any, target: Any, heads: int, causal: bool = True) -> Any:
    """``ml.TransformerBlock.loss``: the mean squared error of the block's output against ``target``."""
    return (transformer_out(params, x, heads, causal) - target).pow(2).mean()


def optimizer(name: str, params: list[Any], lr: float, **options: Any) -> Any:
    """torch's optimizer of the same name as tensorsql's (SGD, Adam, AdamW), with the same options."""
    t = torch()
    return {"SGD": t.optim.SGD, "Adam": t.optim.Adam, "AdamW": t.optim.AdamW}[name](params, lr=lr, **options)


__all__ = [
    "mlp_logits",
    "mlp_loss",
    "optimizer",
    "rmsnorm",
    "tensors",
    "torch",
    "transformer_loss",
    "transformer_out",
]
