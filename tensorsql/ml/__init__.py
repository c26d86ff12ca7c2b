"""Machine learning over tensor relations: losses, optimizers, models and training from warehouse tables."""

from __future__ import annotations

from tensorsql.ml.losses import binary_cross_entropy, mse, softmax_cross_entropy

__all__ = ["binary_cross_entropy", "mse", "softmax_cross_entropy"]
