"""Reverse-mode gradients (``ts.grad``) of every node kind against central finite differences (float64).

Each case builds a scalar loss from placeholders; the loss and its gradients are compiled once
(``Session.compile``) and the finite differences perturb one element at a time through the compiled loss,
so the forward is tensorsql's own (its agreement with numpy is tested elsewhere). Tolerances follow from
the step: central differences err by ~eps² times the third derivative plus ~1e-16 |f| / eps of rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorsql as ts
from tensorsql.ir import expr as E

EPS = 1e-6


@pytest.fixture(scope="module")
def s():
    with ts.connect(threads=1) as session:
        yield session


def numeric(f, arrays, k):
    """d f / d arrays[k] by central differences."""
    x = arrays[k]
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + EPS
        up = float(f(*arrays))
        x[idx] = old - EPS
        down = float(f(*arrays))
        x[idx] = old
        out[idx] = (up - down) / (2 * EPS)
    return out


def check(s, build, arrays, wrt=None, scale=1.0):
    """``build(*relations) -> loss``: ts.grad against finite differences for the operands ``wrt``."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    holders = [s.placeholder(a.shape, "float64", name=f"x{i}") for i, a in enumerate(arrays)]
    loss = build(*holders)
    wrt = list(range(len(arrays))) if wrt is None else wrt
    grads = ts.grad(loss, [holders[k] for k in wrt])
    for k, g in zip(wrt, grads, strict=True):
        assert g.shape == arrays[k].shape and g.node.dtype == "float64"
    f = s.compile(loss, holders)
    got = s.compile(grads, holders)(*arrays)
    value = abs(float(f(*arrays)))
    for k, g in zip(wrt, got, strict=True):
        want = numeric(f, arrays, k)
        # rounding of the differences (~1e-16 |f| / eps) plus the eps² term, on the loss's scale
        tol = 1e-6 * scale * max(1.0, value, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(g, want, rtol=0, atol=tol, err_msg=f"gradient of operand {k}")


RNG = np.random.default_rng(21)


def r(*shape, low=None):
    x = RNG.standard_normal(shape)
    return x if low is None else low + np.abs(x)


def weighted(z, w):
    """A scalar that weighs every element of ``z`` differently (so no gradient is trivially uniform)."""
    letters = "abcdefgh"[: z.ndim]
    return ts.einsum(f"{letters},{letters}->", z, w) if z.ndim else z * w


# ---- contractions and extended EinSums -----------------------------------------------------------------
JOINS = ["multiply", "add", "subtract", "divide", "sqdiff", "absdiff", "max", "min"]


@pytest.mark.parametrize("join", JOINS)
def test_every_join_under_sum(s, join):
    a, b, w = r(3, 4), r(4, 5, low=0.5), r(3, 5)
    check(s, lambda A, B, W: weighted(s.einsum("ij,jk->ik", A, B, join=join), W), [a, b, w], wrt=[0, 1])


@pytest.mark.parametrize("agg", ["max", "min", "prod"])
@pytest.mark.parametrize("join", ["multiply", "add", "sqdiff"])
def test_every_agg(s, join, agg):
    a, b, w = r(3, 4), r(4, 2), r(3, 2)
    check(s, lambda A, B, W: weighted(s.einsum("ij,jk->ik", A, B, join=join, agg=agg), W), [a, b, w], [0, 1])


def test_prod_at_zeros(s):
    """d prod / dx_k is the product of the other elements: G * Z / J was 0/0 (NaN) at a zero, and the NaN
    spread upstream (through a relu that makes zeros, to every weight under it)."""
    a = r(4, 5)
    a[0, 1] = 0.0  # a group with one zero
    a[1, 1] = a[1, 3] = 0.0  # with two
    check(s, lambda A, W: weighted(A.prod(axis=1), W), [a, r(4)], [0])
    check(s, lambda A, B, W: weighted(s.einsum("ij,jk->ik", A, B, join="add", agg="prod"), W),
          [a, np.zeros((5, 2)), r(4, 2)], [0, 1])  # fmt: skip
    v, w = r(3, 4), r(4, 5)
    w[:, 2] = -np.abs(w[:, 2]) - 1.0  # column 2 of relu(v @ w) is all zero when v > 0
    v = np.abs(v)
    check(s, lambda V, W: ts.relu(V @ W).prod(axis=1).sum(), [v, w])
    x = s.from_numpy(a)
    (g,) = ts.grad(x.prod(axis=1).sum(), [x])
    want = np.array([[np.prod(np.delete(row, k)) for k in range(5)] for row in a])
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


CONTRACTIONS = [
    ("ij->i", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii->", [(4, 4)]),
    ("ijk->kj", [(2, 3, 4)]),
    ("ii,ij->j", [(3, 3), (3, 4)]),
    ("ij,ij->ij", [(3, 4), (1, 4)]),  # the second broadcasts along i
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("...i,i->...", [(2, 3, 4), (4,)]),
]
# max over the summed labels too, where the step sums some (and has at most two operands)
CASES = [(spec, shapes, "sum") for spec, shapes in CONTRACTIONS] + [
    (spec, shapes, "max")
    for spec, shapes in CONTRACTIONS
    if len(shapes) <= 2 and spec not in ("ij->ji", "i,j->ij", "ij,ij->ij")
]


@pytest.mark.parametrize(("spec", "shapes", "agg"), CASES)
def test_contractions(s, spec, shapes, agg):
    arrays = [r(*sh) for sh in shapes]
    n = len(arrays)
    out = np.einsum(spec, *arrays)
    w = r(*out.shape)
    check(s, lambda *x: weighted(s.einsum(spec, *x[:n], agg=agg), x[n]), [*arrays, w], wrt=list(range(n)))


# ---- maps, softmax, casts, slices, reblocking -----------------------------------------------------------
MAPS = {
    "exp": (lambda x: ts.exp(x), None),
    "log": (lambda x: ts.log(x), 0.5),
    "sqrt": (lambda x: ts.sqrt(x), 0.5),
    "relu": (lambda x: ts.relu(x), None),
    "neg": (lambda x: -x, None),
    "abs": (lambda x: abs(x), None),
    "pow3": (lambda x: x**3, None),
    "pow_half": (lambda x: ts.pow(x, 0.5), 0.5),
    "pow_neg": (lambda x: ts.pow(x, -1.5), 0.5),
    "scale": (lambda x: ts.scale(x, -2.5), None),
    "square": (lambda x: ts.map(x, "square"), None),
    "reciprocal": (lambda x: ts.map(x, "reciprocal"), 0.5),
    "sigmoid": (lambda x: ts.sigmoid(x), None),
    "tanh": (lambda x: ts.tanh(x), None),
    "softplus": (lambda x: ts.softplus(x), None),
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_every_map(s, name):
    fn, low = MAPS[name]
    x, w = r(3, 4, low=low), r(3, 4)
    if name in ("relu", "abs"):  # keep away from the kink at 0, where the derivative jumps
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    check(s, lambda X, W: weighted(fn(X), W), [x, w], wrt=[0])


@pytest.mark.parametrize("over", [0, 1, [0, 1]])
def test_softmax_and_cross_entropy(s, over):
    x, y = r(3, 4), np.abs(r(3, 4))
    check(s, lambda X, Y: -(Y * ts.log(ts.softmax(X, over=over))).sum(), [x, y], wrt=[0])


@pytest.mark.parametrize("fn", [ts.softmax, ts.log_softmax])
def test_no_gradient_flows_into_a_softmax_shift(s, fn):
    """The max a softmax subtracts changes nothing of its result: the gradient graph has no arg-max mask
    (an ``equal`` join) for it; a max the loss does use still gets one."""
    x, w = r(3, 5), r(3, 5)
    X, W = s.from_numpy(x), s.from_numpy(w)
    (g,) = ts.grad((fn(X, over=1) * W).sum(), [X])
    joins = {n.join for n in E.topological(g.node) if isinstance(n, E.EinSum)}
    assert "equal" not in joins
    check(s, lambda A, B: (fn(A, over=1) * B).sum(), [x, w], wrt=[0])
    (h,) = ts.grad(s.einsum("ij->i", X, agg="max").sum(), [X])
    assert "equal" in {n.join for n in E.topological(h.node) if isinstance(n, E.EinSum)}


def test_tied_maxima_share_the_gradient(s):
    """``k`` elements tied for a max or min each get ``G / k`` (torch's ``amax``): the gradient of a function
    that is smooth where the ties come from the join's plateau, max_j max(a, b_j) = a, is 1, not the count."""
    a, b = s.from_numpy(np.array([5.0, 0.5])), s.from_numpy(np.array([1.0, 2.0, 3.0]))
    for agg in ("max", "min"):
        ga, gb = ts.grad(s.einsum("i,j->i", a, b, join="max", agg=agg).sum(), [a, b])
        want_b = [0.0, 0.0, 1.0] if agg == "max" else [1.0, 0.0, 0.0]  # b wins for a = 0.5
        np.testing.assert_array_equal(ga.numpy(), [1.0, 0.0])
        np.testing.assert_array_equal(gb.numpy(), want_b)
    x = np.array([[1.0, 3.0, 3.0, 2.0], [4.0, 4.0, 4.0, 0.0]])
    w = np.array([2.0, 6.0])
    X = s.from_numpy(x)
    (g,) = ts.grad((s.einsum("ij->i", X, agg="max") * w).sum(), [X])
    np.testing.assert_allclose(g.numpy(), [[0, 1, 1, 0], [2, 2, 2, 0]], rtol=1e-15)
    (g,) = ts.grad(s.einsum("ij->", X, agg="min"), [X])
    np.testing.assert_allclose(g.numpy(), [[0, 0, 0, 0], [0, 0, 0, 1]], rtol=1e-15)


def test_a_zeroth_power_has_zero_gradient_also_at_zero(s):
    x = np.array([0.0, -0.0, 1.5, -2.0])
    X = s.from_numpy(x)
    (g,) = ts.grad((X**0).sum(), [X])
    np.testing.assert_array_equal(g.numpy(), np.zeros(4))
    (g,) = ts.grad((ts.pow(X, 0) * X).sum(), [X])
    np.testing.assert_array_equal(g.numpy(), np.ones(4))


def test_casts(s):
    """float64 -> float32 -> float64: the gradient passes each cast back in the input's dtype. Finite
    differences cannot see through float32's rounding at this step, so the closed form is the reference."""
    x, w = r(3, 4), r(3, 4)
    X, W = s.from_numpy(x), s.from_numpy(w)
    (g,) = ts.grad(weighted(X.astype("float32").astype("float64") ** 2, W), [X])
    assert g.node.dtype == "float64"
    x32 = x.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(g.numpy(), 2 * x32 * w, rtol=1e-6)  # the float32 hop rounds the gradient


@pytest.mark.parametrize(
    "key", [(slice(1, None, 2), slice(None, None, -1)), 2, (Ellipsis, 0), (slice(None), slice(1, 3))]
)
def test_slices(s, key):
    x = r(5, 4)
    w = r(*x[key].shape)
    check(s, lambda X, W: weighted(X[key] * X[key], W), [x, w], [0])


def test_reblock_and_an_operand_used_many_times(s):
    x, w = r(4, 4), r(4, 4)
    check(s, lambda X, W: weighted(X.reblock((2, 2)) * X + X @ X.T, W) + (X * X).sum(), [x, w], [0, 1])


def test_mlp_and_an_intermediate(s):
    x, w1, w2, y = r(5, 3), r(3, 4), r(4, 2), r(5, 2)

    def loss(X, W1, W2, Y):
        return (((ts.relu(X @ W1) @ W2) - Y) ** 2).mean()

    check(s, loss, [x, w1, w2, y], wrt=[1, 2])
    # with respect to an intermediate: the hidden layer
    X, W1, W2, Y = (s.from_numpy(a) for a in (x, w1, w2, y))
    hidden = ts.relu(X @ W1)
    (g,) = ts.grad((((hidden @ W2) - Y) ** 2).sum(), [hidden])
    np.testing.assert_allclose(g.numpy(), 2 * (np.maximum(x @ w1, 0) @ w2 - y) @ w2.T, atol=1e-12)


def test_a_gradient_is_a_lazy_relation_over_the_forward_nodes(s):
    X, W = s.from_numpy(r(4, 3)), s.from_numpy(r(3, 2))
    z = ts.sigmoid(X @ W)
    (g,) = ts.grad(z.sum(), [W])
    assert isinstance(g, ts.TensorRelation) and g.shape == (3, 2)
    assert "Source" in g.explain() and "sigmoid" in g.explain()
    # a float32 graph gives float32 gradients
    X32, W32 = s.from_numpy(r(4, 3).astype(np.float32)), s.from_numpy(r(3, 2).astype(np.float32))
    (g32,) = ts.grad((X32 @ W32).sum(), [W32])
    assert g32.node.dtype == "float32"
    np.testing.assert_allclose(g32.numpy(), X32.numpy().sum(0)[:, None] * np.ones((1, 2)), rtol=1e-6)


def test_masks_and_unreached_operands_have_zero_gradient(s):
    x, y = r(3, 3), r(3, 3)
    X, Y = s.from_numpy(x), s.from_numpy(y)
    gx, gy = ts.grad(((X > Y) * 2.0).sum() + X.sum(), [X, Y])
    np.testing.assert_array_equal(gx.numpy(), np.ones((3, 3)))
    np.testing.assert_array_equal(gy.numpy(), np.zeros((3, 3)))


# ---- errors -----------------------------------------------------------------------------------------------
def test_errors(s):
    X = s.from_numpy(r(3, 3))
    other = s.from_numpy(r(3, 3))
    with pytest.raises(ts.GradError, match=r"must be a scalar \(0-d\) relation, got shape \(3, 3\)"):
        ts.grad(X * 2, [X])
    with pytest.raises(ts.GradError, match=r"wrt\[0\] \(shape \(3, 3\)\) is not in the loss's graph"):
        ts.grad(X.sum(), [other])
    with pytest.raises(ts.GradError, match="must be float32 or float64, got int64"):
        I = s.from_numpy(np.arange(9).reshape(3, 3))  # noqa: E741
        ts.grad(I.sum(), [I])
    with pytest.raises(ts.GradError, match="wrt must be a list of relations"):
        ts.grad(X.sum(), X)
    with pytest.raises(ts.GradError, match=r"wrt\[0\] must be a relation, got ndarray"):
        ts.grad(X.sum(), [np.ones(3)])
    with pytest.raises(ts.GradError, match="the loss must be a relation"):
        ts.grad(3.0, [X])
    with ts.connect() as elsewhere:
        Z = elsewhere.from_numpy(r(3, 3))
        with pytest.raises(ts.GradError, match="belongs to another session"):
            ts.grad(X.sum(), [Z])
    assert issubclass(ts.GradError, ValueError) and issubclass(ts.GradError, ts.TensorSQLError)
    # a complex intermediate: its rules had dropped it, a zero gradient without a word
    with pytest.raises(ts.GradError, match="through a complex128 intermediate"):
        ts.grad(abs(X.astype("complex128")).sum(), [X])
    with pytest.raises(ts.GradError, match="through a complex64 intermediate"):
        ts.grad((X.astype("complex64").astype("float64") * 3).sum(), [X])
    I = X.astype("int64").astype("float64")  # noqa: E741  integers are piecewise constant: gradient 0
    np.testing.assert_array_equal(ts.grad((I * X).sum(), [X])[0].numpy(), I.numpy())


def test_a_deep_networks_gradient_plans(s):
    """60 residual layers of 4x4 (a gradient graph ~10 recursive frames per layer, past Python's default
    limit: a RecursionError), and 80 plain or 40 weight-sharing layers (size-1 planning domains joined into a
    table of more than numpy's 64 axes: a ValueError). Checked against numpy's forward and backward."""
    rng = np.random.default_rng(4)
    for depth, shared, resid in ((60, False, True), (80, False, False), (40, True, False)):
        x = rng.standard_normal((4, 4)) * 0.3
        ws = [rng.standard_normal((4, 4)) * 0.5 for _ in range(1 if shared else depth)]
        W = [s.from_numpy(w) for w in ws]
        layers = [W[0]] * depth if shared else W
        h = s.from_numpy(x)
        for w in layers:
            h = ts.tanh(h @ w) + h * 0.5 if resid else ts.tanh(h @ w)
        (g,) = ts.grad((h * h).sum(), [W[0]])
        # numpy: forward keeping the activations, then back
        hs, pre = [x], []
        for w in [ws[0]] * depth if shared else ws:
            pre.append(hs[-1] @ w)
            hs.append(np.tanh(pre[-1]) + (0.5 * hs[-1] if resid else 0.0))
        gh, gw = 2 * hs[-1], np.zeros((4, 4))
        for k in range(depth - 1, -1, -1):
            w = ws[0] if shared else ws[k]
            gp = gh * (1 - np.tanh(pre[k]) ** 2)
            if shared or k == 0:
                gw += hs[k].T @ gp
            gh = gp @ w.T + (0.5 * gh if resid else 0.0)
        np.testing.assert_allclose(g.numpy(), gw, rtol=1e-9, atol=1e-12 * max(1.0, np.abs(gw).max()))


def test_empty_slices_stay_in_the_graph(s):
    """An empty slice was a new relation of zeros, cut from its input: grad said wrt was not in the graph."""
    X = s.from_numpy(r(2, 3))
    for key in (np.s_[0:0], np.s_[:, 1:1], np.s_[1, 2:2]):
        empty = X[key]
        assert empty.shape == np.zeros((2, 3))[key].shape
        (g,) = ts.grad(empty.sum() + (X * X).sum(), [X])
        np.testing.assert_allclose(g.numpy(), 2 * X.numpy(), rtol=1e-15)


def test_compute_runs_the_shared_forward_pass_once(s, monkeypatch):
    """``Session.compute([loss, *grads])``: the steps the loss and its gradients share are stored once and
    read by all; the values equal each relation computed on its own."""
    x, w, y = r(6, 4), r(4, 3), r(6, 3)
    X, W, Y = s.from_numpy(x), s.from_numpy(w), s.from_numpy(y)
    product = X @ W
    loss = ((ts.tanh(product) - Y) ** 2).sum()
    grads = ts.grad(loss, [W, X])
    alone = [rel.numpy() for rel in (loss, *grads)]
    stored = []
    real = s.materialize
    monkeypatch.setattr(s, "materialize", lambda rel: stored.append(rel.node) or real(rel))
    together = s.compute([loss, *grads])
    for got, want in zip(together, alone, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the product X @ W is computed in exactly one statement: the stored step above it
    computed_in = [n for n in stored if any(m is product.node for m in E.topological(n))]
    assert len(computed_in) == 1
    with pytest.raises(ts.ShapeError, match="compute takes a list of relations"):
        s.compute(loss)


def test_compile_shares_the_steps_its_outputs_use(s):
    """``compile(..., share=True)``: the shared forward steps run once per call (one statement of the
    embedded executor: ``tests/execution/test_many.py``); the results equal the unshared compile's."""
    x, w, y = r(6, 4), r(4, 3), r(6, 3)
    X, W, Y = (s.placeholder(a.shape, "float64", name=n) for a, n in ((x, "x"), (w, "w"), (y, "y")))
    loss = ((ts.tanh(X @ W) - Y) ** 2).sum()
    outputs = [loss, *ts.grad(loss, [W, X])]
    plain = s.compile(outputs, [X, W, Y])
    shared = s.compile(outputs, [X, W, Y], share=True)
    assert shared._many is not None and plain._many is None and not plain._stages
    for _ in range(2):  # planned once, run on new arrays each call
        x, w = r(6, 4), r(4, 3)
        for got, want in zip(shared(x, w, y), plain(x, w, y), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ts.ConfigError, match="share= must be a bool"):
        s.compile(outputs, [X, W, Y], share="yes")
