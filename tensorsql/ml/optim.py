"""Optimizers: updates as element-wise EinSums over weight relations, their state kept as relations.

``step(params, grads)`` builds each update lazily from the parameter, its gradient and its state (the same
graph steps as any expression: joins and maps), then stores the new parameters and state
(``Session.materialize``), so the next step starts from stored relations and no graph grows across steps.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tensorsql.errors import ConfigError, ShapeError

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation


def _number(value: object, what: str, low: float = 0.0, high: float = math.inf, closed: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    v = float(value)
    if not (low <= v <= high) or (not closed and v == low):
        raise ConfigError(f"{what}={v} is out of range")
    return v


class Optimizer:
    """The update rule of one optimizer over a fixed list of parameters (matched by position)."""

    #: names of the per-parameter state relations (their values: zeros at the start)
    state_names: tuple[str, ...] = ()

    def __init__(self, lr: float) -> None:
        self.lr = _number(lr, f"{type(self).__name__}: lr", closed=False)
        self.state: list[dict[str, TensorRelation]] = []
        self.steps = 0

    def step(self, params: Sequence[TensorRelation], grads: Sequence[TensorRelation]) -> list[TensorRelation]:
        """The parameters after one update, stored; the state advances with them."""
        from tensorsql.relation import TensorRelation

        for what, given in (("params", params), ("grads", grads)):
            if not isinstance(given, Sequence) or not all(isinstance(r, TensorRelation) for r in given):
                raise ConfigError(f"step: {what} must be a sequence of tensor relations, got {given!r:.80}")
        if len(params) != len(grads):
            raise ShapeError(f"step: {len(params)} parameters but {len(grads)} gradients")
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            if p.shape != g.shape:
                raise ShapeError(f"step: parameter {i} has shape {p.shape}, its gradient {g.shape}")
        if not self.state:
            self.state = [{name: p * 0.0 for name in self.state_names} for p in params]
        elif len(self.state) != len(params):
            held = len(self.state)
            raise ShapeError(f"step: the optimizer holds state for {held} parameters, got {len(params)}")
        else:  # its state would broadcast against another parameter's shape, and change the parameter's
            for i, (p, st) in enumerate(zip(params, self.state, strict=True)):
                for name, v in st.items():
                    if v.shape != p.shape:
                        raise ShapeError(
                            f"step: parameter {i} has shape {p.shape}, but the optimizer's {name!r} state "
                            f"for it has shape {v.shape} (an optimizer steps one set of parameters)"
                        )
        self.steps += 1
        factors = self.factors(self.steps)
        out: list[TensorRelation] = []
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            s = p.session
            g = s.materialize(g)  # read by the update and by every state update: computed once
            new, state = self.update(p, g, self.state[i], factors)
            self.state[i] = {k: s.materialize(v) for k, v in state.items()}
            out.append(s.materialize(new))
        return out

    def factors(self, t: int) -> dict[str, float]:
        """The scalars of step ``t`` (1, 2, ...) the update multiplies by (Adam's bias corrections): numbers
        here, or 0-d relations where a compiled step binds them per call (``fit``)."""
        return {}

    def update(
        self,
        p: TensorRelation,
        g: TensorRelation,
        state: dict[str, TensorRelation],
        factors: dict[str, object],
    ) -> tuple[TensorRelation, dict[str, TensorRelation]]:
        raise NotImplementedError


class SGD(Optimizer):
    """``v = momentum * v + g`` (``nesterov``: step with ``g + momentum * v``); ``p -= lr * v``;
    ``weight_decay`` adds ``weight_decay * p`` to the gradient (L2)."""

    def __init__(
        self, lr: float = 0.01, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0
    ) -> None:
        super().__init__(lr)
        self.momentum = _number(momentum, "SGD: momentum", 0.0, 1.0)
        self.weight_decay = _number(weight_decay, "SGD: weight_decay")
        if not isinstance(nesterov, bool):
            raise ConfigError(f"SGD: nesterov must be a bool, got {nesterov!r}")
        if nesterov and self.momentum == 0.0:
            raise ConfigError("SGD: nesterov needs momentum > 0")
        self.nesterov = nesterov
        self.state_names = ("velocity",) if self.momentum else ()

    def update(self, p, g, state, factors):  # type: ignore[no-untyped-def]
        if self.weight_decay:
            g = g + p * self.weight_decay
        if not self.momentum:
            return p - g * self.lr, {}
        v = state["velocity"] * self.momentum + g
        direction = g + v * self.momentum if self.nesterov else v
        return p - direction * self.lr, {"velocity": v}


class Adam(Optimizer):
    """Adam (Kingma and Ba): moments ``m``, ``v`` with bias correction; ``weight_decay`` is added to the
    gradient (L2, as torch's Adam)."""

    state_names = ("m", "v")
    decoupled = False
    #: the weight decay when none is given
    default_decay = 0.0

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float | None = None,
    ) -> None:
        super().__init__(lr)
        if not isinstance(betas, tuple | list) or len(betas) != 2:
            raise ConfigError(f"{type(self).__name__}: betas must be a pair, got {betas!r}")
        name = type(self).__name__
        self.beta1 = _number(betas[0], f"{name}: betas[0]", 0.0, 1.0)
        self.beta2 = _number(betas[1], f"{name}: betas[1]", 0.0, 1.0)
        if self.beta1 == 1.0 or self.beta2 == 1.0:
            raise ConfigError(f"{name}: betas must be below 1, got {betas!r}")
        self.eps = _number(eps, f"{name}: eps", closed=False)
        decay = self.default_decay if weight_decay is None else weight_decay
        self.weight_decay = _number(decay, f"{name}: weight_decay")

    def factors(self, t: int) -> dict[str, float]:
        return {"step": self.lr / (1.0 - self.beta1**t), "vscale": 1.0 / (1.0 - self.beta2**t)}

    def update(self, p, g, state, factors):  # type: ignore[no-untyped-def]
        if self.weight_decay and not self.decoupled:
            g = g + p * self.weight_decay
        m = state["m"] * self.beta1 + g * (1.0 - self.beta1)
        v = state["v"] * self.beta2 + (g * g) * (1.0 - self.beta2)
        denom = (v * factors["vscale"]) ** 0.5 + self.eps
        new = p - (m / denom) * factors["step"]
        if self.weight_decay and self.decoupled:
            new = new - p * (self.lr * self.weight_decay)
        return new, {"m": m, "v": v}


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter): ``p -= lr * weight_decay * p`` beside the
    Adam step, as torch's AdamW (default ``weight_decay`` 0.01)."""

    decoupled = True
    default_decay = 0.01


__all__ = ["SGD", "Adam", "AdamW", "Optimizer"]
