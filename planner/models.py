"""Workload graphs for tests and benchmarks: a LLaMA-shaped transformer and the paper's matrix chain."""

from __future__ import annotations

from .einsum import PlanningError
from .graph import EinGraph, Vertex

__all__ = ["attention_block", "llama_graph", "matrix_chain"]


def attention_block(g: EinGraph, x: Vertex, heads: int, prefix: str) -> Vertex:
    """Multi-head attention as extended EinSums: projections, scores, scale, softmax, O, Y.

    Softmax over s' is four steps: C = max, E = exp(T - C) (subtract, then an element-wise exp),
    S = sum of E, Y = E / S. Returns the attention output Y[s, a] (before the residual add).
    """
    _seq, model = x.shape
    if model % heads:
        raise PlanningError(f"model size {model} is not a multiple of heads {heads}")
    hd = model // heads
    wq = g.input(f"{prefix}WQ", (model, heads, hd))
    wk = g.input(f"{prefix}WK", (model, heads, hd))
    wv = g.input(f"{prefix}WV", (model, heads, hd))
    wo = g.input(f"{prefix}WO", (model, heads, hd))
    qh = g.einsum("sa,ahd->shd", x, wq, name=f"{prefix}QH")
    kh = g.einsum("ta,ahd->thd", x, wk, name=f"{prefix}KH")
    vh = g.einsum("ta,ahd->thd", x, wv, name=f"{prefix}VH")
    t = g.einsum("shd,thd->hst", qh, kh, name=f"{prefix}T")
    ts = g.einsum("hst->hst", t, join="scale", name=f"{prefix}Tscaled")
    c = g.einsum("hst->hs", ts, join="identity", agg="max", name=f"{prefix}C")
    diff = g.einsum("hst,hs->hst", ts, c, join="subtract", name=f"{prefix}Tminus")
    e = g.einsum("hst->hst", diff, join="exp", name=f"{prefix}E")
    s = g.einsum("hst->hs", e, name=f"{prefix}S")
    p = g.einsum("hst,hs->hst", e, s, join="divide", name=f"{prefix}P")
    o = g.einsum("hst,thd->shd", p, vh, name=f"{prefix}O")
    return g.einsum("shd,ahd->sa", o, wo, name=f"{prefix}Y")


def llama_graph(
    layers: int = 32,
    seq: int = 4096,
    model: int = 4096,
    heads: int = 32,
    ffn: int = 11008,
    gated: bool = True,
) -> EinGraph:
    """A LLaMA-7B-shaped decoder stack: per layer attention + residual, then a (SiLU-gated) feed-forward
    + residual. ``gated=False`` gives the two-matmul ReLU feed-forward. 19 EinSums per layer when gated."""
    if layers < 1:
        raise PlanningError(f"layers must be >= 1, got {layers}")
    g = EinGraph()
    x = g.input("X", (seq, model))
    for n in range(layers):
        pre = f"L{n}."
        y = attention_block(g, x, heads, pre)
        r = g.einsum("sa,sa->sa", x, y, join="add", name=f"{pre}R1")
        w1 = g.input(f"{pre}W1", (model, ffn))
        w2 = g.input(f"{pre}W2", (ffn, model))
        h = g.einsum("sa,af->sf", r, w1, name=f"{pre}H")
        if gated:
            w3 = g.input(f"{pre}W3", (model, ffn))
            act = g.einsum("sf->sf", h, join="silu", name=f"{pre}Act")
            up = g.einsum("sa,af->sf", r, w3, name=f"{pre}Up")
            h = g.einsum("sf,sf->sf", act, up, name=f"{pre}Gate")
        else:
            h = g.einsum("sf->sf", h, join="relu", name=f"{pre}Act")
        f = g.einsum("sf,fa->sa", h, w2, name=f"{pre}Down")
        x = g.einsum("sa,sa->sa", r, f, join="add", name=f"{pre}R2")
    return g


def matrix_chain(kind: str = "square", s: int = 1000) -> EinGraph:
    """The paper's chain (AxB) + (Cx(DxE)).

    square: every matrix sxs. skewed: A sx0.1s, B 0.1sxs, C sx0.1s, D 0.1sx10s, E 10sxs (s a multiple
    of 10), the shapes on which the paper reports a 2x gap between EinDecomp and SQRT.
    """
    if kind == "square":
        shapes = {n: (s, s) for n in "ABCDE"}
    elif kind == "skewed":
        if s % 10:
            raise PlanningError(f"skewed chain needs s divisible by 10, got {s}")
        t = s // 10
        shapes = {"A": (s, t), "B": (t, s), "C": (s, t), "D": (t, 10 * s), "E": (10 * s, s)}
    else:
        raise PlanningError(f"matrix_chain kind must be 'square' or 'skewed', got {kind!r}")
    g = EinGraph()
    a, b, c, d, e = (g.input(n, shapes[n]) for n in "ABCDE")
    ab = g.einsum("ij,jk->ik", a, b, name="AB")
    de = g.einsum("ij,jk->ik", d, e, name="DE")
    cde = g.einsum("ij,jk->ik", c, de, name="CDE")
    g.einsum("ij,ij->ij", ab, cde, join="add", name="Z")
    return g
