"""Machine learning over tensor relations: losses, optimizers, models and training from warehouse tables."""

from __future__ import annotations

from tensorsql.ml.losses import binary_cross_entropy, mse, softmax_cross_entropy
from tensorsql.ml.models import (
    MLP,
    LinearRegression,
    LogisticRegression,
    Model,
    SoftmaxRegression,
    TransformerBlock,
    load,
)
from tensorsql.ml.optim import SGD, Adam, AdamW, Optimizer
from tensorsql.ml.train import History, fit

__all__ = [
    "MLP",
    "SGD",
    "Adam",
    "AdamW",
    "History",
    "LinearRegression",
    "LogisticRegression",
    "Model",
    "Optimizer",
    "SoftmaxRegression",
    "TransformerBlock",
    "binary_cross_entropy",
    "fit",
    "load",
    "mse",
    "softmax_cross_entropy",
]
