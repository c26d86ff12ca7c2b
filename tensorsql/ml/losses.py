"""Losses as relations: each a scalar built from the graph's own steps, so ``ts.grad`` differentiates it
and EinDecomp plans it with the model's forward pass. Labels may be relations or arrays."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tensorsql import api
from tensorsql.errors import DTypeError, OperatorError, ShapeError

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation


def _pair(pred: TensorRelation, target: object, what: str) -> TensorRelation:
    from tensorsql.relation import TensorRelation

    if not isinstance(pred, TensorRelation):
        raise OperatorError(
            f"{what}: the predictions must be a relation (the model's output), got {type(pred).__name__}"
        )
    if not isinstance(target, TensorRelation):
        # an array takes the predictions' float dtype (float32 predictions stay float32); against integer
        # predictions, numpy's promotion (a float target is not truncated to the predictions' integers)
        arr = np.asarray(target)
        if arr.dtype.kind not in "biufc":
            raise DTypeError(
                f"{what}: the targets must be numbers, got {type(target).__name__} of {arr.dtype}"
            )
        kind = np.dtype(pred.dtype).kind
        target = arr.astype(pred.dtype if kind in "fc" else np.result_type(pred.dtype, arr.dtype), copy=False)
    t = pred.session.as_relation(target)
    if t.shape != pred.shape:
        raise ShapeError(f"{what}: the targets have shape {t.shape}, the predictions {pred.shape}")
    return t


def mse(pred: TensorRelation, target: object) -> TensorRelation:
    """Mean squared error over every element."""
    t = _pair(pred, target, "mse")
    return ((pred - t) ** 2).mean()


def binary_cross_entropy(logits: TensorRelation, labels: object) -> TensorRelation:
    """Mean of ``softplus(z) - y z`` over every element: the cross-entropy of ``sigmoid(z)`` against labels
    in [0, 1], from the logits ``z`` (finite for any logit; its gradient is ``sigmoid(z) - y``)."""
    y = _pair(logits, labels, "binary_cross_entropy")
    return (api.softplus(logits) - logits * y).mean()


def softmax_cross_entropy(logits: TensorRelation, labels: object, over: int = -1) -> TensorRelation:
    """Mean over the rows (every axis but ``over``) of ``-sum(y * log_softmax(z))`` over ``over``: labels
    are one-hot rows or probabilities."""
    y = _pair(logits, labels, "softmax_cross_entropy")
    if (
        isinstance(over, bool)
        or not isinstance(over, int | np.integer)
        or not -logits.ndim <= over < logits.ndim
    ):
        raise OperatorError(
            f"softmax_cross_entropy: over must be an axis (int) of the logits' {logits.ndim}, got {over!r}"
        )
    rows = math.prod(n for i, n in enumerate(logits.shape) if i != over % logits.ndim)
    return -(y * api.log_softmax(logits, over=over)).sum() * (1.0 / max(1, rows))


__all__ = ["binary_cross_entropy", "mse", "softmax_cross_entropy"]
