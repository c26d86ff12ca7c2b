"""tensorsql's gradients and training against torch's (float64), where torch is installed.

torch is not installed by ``make test`` (its wheel is large); ``make test-torch`` installs the CPU build and
runs these (``pytest -m torch``). Without torch every test here is skipped, saying so.

Each gradient is of a scalar built the same way in both: the einsum, join, aggregation, map, softmax or
loss, weighted by a random tensor so no gradient is uniform. Training runs tensorsql's compiled step
(``fit``'s ``Stepper``) and torch's optimizers on the same weights and batches, step by step.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_api
from test_autodiff import CONTRACTIONS, JOINS

import tensorsql as ts
from benchmarks import torch_peers
from tensorsql import ml
from tensorsql.ml import train
from tensorsql.ml.train import Stepper

torch = pytest.importorskip("torch", reason="torch is not installed (make test-torch installs the CPU build)")
pytestmark = pytest.mark.torch
F = torch.nn.functional

RNG = np.random.default_rng(33)


@pytest.fixture(scope="module")
def s():
    with ts.connect(threads=2) as session:
        yield session


def r(*shape, low=None):
    x = RNG.standard_normal(shape)
    return x if low is None else low + np.abs(x)


def against_torch(s, ours, theirs, arrays, wrt=None):
    """The loss ``ours(*relations)`` and its gradients against ``theirs(*tensors)`` under autograd."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    wrt = list(range(len(arrays))) if wrt is None else wrt
    holders = [s.placeholder(a.shape, "float64", name=f"x{i}") for i, a in enumerate(arrays)]
    loss = ours(*holders)
    got_loss, *got = s.compile([loss, *ts.grad(loss, [holders[k] for k in wrt])], holders)(*arrays)
    leaves = [torch.tensor(a, requires_grad=k in wrt) for k, a in enumerate(arrays)]
    loss = theirs(*leaves)
    loss.backward()
    want_loss = float(loss.detach())
    scale = max(1.0, abs(want_loss))
    # both sum the same float64 terms in other orders: a few ulps of the magnitudes summed, ~1e-12 relative
    assert abs(float(got_loss) - want_loss) <= 1e-11 * scale
    for k, g in zip(wrt, got, strict=True):
        want = leaves[k].grad.numpy()
        tol = 1e-11 * max(1.0, float(np.abs(want).max(initial=0)), scale)
        np.testing.assert_allclose(g, want, rtol=0, atol=tol, err_msg=f"gradient of operand {k}")


def weighted(s, z, w):
    letters = "abcdefgh"[: z.ndim]
    return s.einsum(f"{letters},{letters}->", z, w) if z.ndim else z * w


# numpy's joins where the operators work on tensors too; torch's own abs, maximum and minimum
TORCH_JOIN = {
    **test_api.JOINS,
    "absdiff": lambda a, b: (a - b).abs(),
    "max": torch.maximum,
    "min": torch.minimum,
}


@pytest.mark.parametrize("join", JOINS)
@pytest.mark.parametrize("agg", ["sum", "max", "min", "prod"])
def test_extended_einsum_joins_and_aggregations(s, join, agg):
    a, b, w = r(3, 4), r(4, 5, low=0.5), r(3, 5)

    def theirs(A, B, W):
        pairs = TORCH_JOIN[join](A[:, :, None], B[None, :, :])
        z = {"sum": pairs.sum(1), "max": pairs.amax(1), "min": pairs.amin(1), "prod": pairs.prod(1)}[agg]
        return (z * W).sum()

    def ours(A, B, W):
        return weighted(s, s.einsum("ij,jk->ik", A, B, join=join, agg=agg), W)

    against_torch(s, ours, theirs, [a, b, w], [0, 1])


@pytest.mark.parametrize(("spec", "shapes"), CONTRACTIONS)
def test_contractions(s, spec, shapes):
    arrays = [r(*sh) for sh in shapes]
    n = len(arrays)
    w = r(*np.einsum(spec, *arrays).shape)
    against_torch(
        s,
        lambda *x: weighted(s, s.einsum(spec, *x[:n]), x[n]),
        lambda *x: (torch.einsum(spec, *x[:n]) * x[n]).sum(),
        [*arrays, w],
        list(range(n)),
    )


MAPS = {
    "exp": (ts.exp, torch.exp, None),
    "log": (ts.log, torch.log, 0.5),
    "sqrt": (ts.sqrt, torch.sqrt, 0.5),
    "relu": (ts.relu, torch.relu, None),
    "abs": (abs, torch.abs, None),
    "neg": (lambda x: -x, torch.neg, None),
    "pow": (lambda x: x**3, lambda x: x**3, None),
    "pow_neg": (lambda x: ts.pow(x, -1.5), lambda x: x**-1.5, 0.5),
    "scale": (lambda x: ts.scale(x, -2.5), lambda x: x * -2.5, None),
    "square": (lambda x: ts.map(x, "square"), torch.square, None),
    "reciprocal": (lambda x: ts.map(x, "reciprocal"), torch.reciprocal, 0.5),
    "sigmoid": (ts.sigmoid, torch.sigmoid, None),
    "tanh": (ts.tanh, torch.tanh, None),
    "softplus": (ts.softplus, F.softplus, None),
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_maps(s, name):
    ours, theirs, low = MAPS[name]
    a, w = r(3, 4, low=low), r(3, 4)
    against_torch(s, lambda A, W: weighted(s, ours(A), W), lambda A, W: (theirs(A) * W).sum(), [a, w], [0])


@pytest.mark.parametrize("over", [0, 1])
def test_softmax_and_log_softmax(s, over):
    a, w = r(4, 5) * 3, r(4, 5)
    against_torch(
        s,
        lambda A, W: (
            weighted(s, ts.softmax(A, over=over), W) + weighted(s, ts.log_softmax(A, over=over), W * W)
        ),
        lambda A, W: (F.softmax(A, dim=over) * W).sum() + (F.log_softmax(A, dim=over) * W * W).sum(),
        [a, w],
        [0],
    )


def test_losses(s):
    z, y, p = r(6, 3), (RNG.random((6, 3)) > 0.5).astype(float), RNG.dirichlet(np.ones(3), 6)
    against_torch(
        s,
        lambda Z, Y, P: ml.mse(Z, P) + ml.binary_cross_entropy(Z, Y) + ml.softmax_cross_entropy(Z, P, over=1),
        lambda Z, Y, P: F.mse_loss(Z, P) + F.binary_cross_entropy_with_logits(Z, Y) + F.cross_entropy(Z, P),
        [z, y, p],
        [0],
    )


def test_transformer_block_loss_and_every_weight_gradient(s):
    model = ml.TransformerBlock(s, 16, 4, 32, dtype="float64", seed=5)
    x, target = r(12, 16), r(12, 16)
    loss = model.loss(model.forward(x), target)
    got = s.compute([loss, *ts.grad(loss, [model.params[k] for k in model.names])])
    params = torch_peers.tensors(model.weights(), grad=True)
    want = torch_peers.transformer_loss(params, torch.tensor(x), torch.tensor(target), heads=4)
    want.backward()
    want = want.detach()
    assert abs(float(got[0]) - float(want)) <= 1e-12 * max(1.0, float(want))
    for name, g in zip(model.names, got[1:], strict=True):
        w = params[name].grad.numpy()
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-11 * max(1.0, np.abs(w).max()), err_msg=name)


OPTIMIZERS = [
    (ml.SGD(0.1), "SGD", {"lr": 0.1}),
    (ml.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), "SGD",
     {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    (ml.Adam(0.01), "Adam", {"lr": 0.01}),
    (ml.AdamW(0.01, weight_decay=0.05), "AdamW", {"lr": 0.01, "weight_decay": 0.05}),
]  # fmt: skip


@pytest.mark.parametrize(("ours", "name", "options"), OPTIMIZERS, ids=["sgd", "nesterov", "adam", "adamw"])
def test_mlp_training_matches_torch_step_by_step(s, ours, name, options):
    """The same initial weights and batches: every step's loss and the final weights agree with torch's."""
    layers, batch, steps = [7, 12, 9, 4], 16, 12
    model = ml.MLP(s, layers, dtype="float64", seed=3)
    params = torch_peers.tensors(model.weights(), grad=True)
    opt = torch_peers.optimizer(name, [params[k] for k in model.names], **options)
    stepper = Stepper(model, ours)
    rng = np.random.default_rng(8)
    xs = rng.standard_normal((steps, batch, layers[0]))
    ys = rng.integers(0, layers[-1], (steps, batch))
    for t in range(steps):
        got = stepper.step(xs[t], model.targets(ys[t]))
        opt.zero_grad()
        want = torch_peers.mlp_loss(params, torch.tensor(xs[t]), torch.tensor(ys[t]), depth=len(layers) - 1)
        want.backward()
        opt.step()
        want = want.detach()
        assert abs(got - float(want)) <= 1e-10 * max(1.0, float(want)), f"step {t}"
    stepper.sync()
    for k, w in model.weights().items():
        np.testing.assert_allclose(w, params[k].detach().numpy(), rtol=0, atol=1e-10, err_msg=k)


def test_fit_float32_mlp_tracks_torch(s):
    """float32 training through ``fit`` from a table: its epoch losses follow torch's on the same data order
    (the order fit's shuffle gave, read back from its own query) within float32 drift."""
    layers, batch = [5, 16, 3], 32
    rng = np.random.default_rng(4)
    x = rng.standard_normal((160, layers[0])).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    con = s.executor.con
    feats = ["a", "b", "c", "d", "e"]
    con.register("_torch_rows", {**{f: x[:, j] for j, f in enumerate(feats)}, "y": y})
    s.execute("CREATE OR REPLACE TABLE torch_rows AS SELECT * FROM _torch_rows")
    con.unregister("_torch_rows")
    model = ml.MLP(s, layers, dtype="float32", seed=1)
    params = torch_peers.tensors(model.weights(), grad=True)
    opt = torch_peers.optimizer("Adam", [params[k] for k in model.names], lr=0.05)
    history = ml.fit(model, "torch_rows", feats, "y", epochs=3, batch_size=batch, optimizer=ml.Adam(0.05),
                     progress=False)  # fmt: skip
    stored = con.sql("SELECT *, hash(a, b, c, d, e, y) AS h FROM torch_rows").fetchnumpy()
    for epoch in range(3):  # fit's order: rows sorted by the epoch key of their row hash (seed 0)
        order = np.argsort(train._epoch_keys(np.asarray(stored["h"], dtype=np.uint64), 0, epoch))
        xe = np.column_stack([stored[f][order] for f in feats]).astype(np.float32)
        ye = np.asarray(stored["y"][order], dtype=np.int64)
        total = 0.0
        for lo in range(0, len(ye), batch):
            opt.zero_grad()
            xb, yb = torch.tensor(xe[lo : lo + batch]), torch.tensor(ye[lo : lo + batch])
            loss = torch_peers.mlp_loss(params, xb, yb, depth=2)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(yb)
        assert abs(history.losses[epoch] - total / len(ye)) <= 1e-4 * max(1.0, total / len(ye)), epoch
    for k, w in model.weights().items():
        np.testing.assert_allclose(w, params[k].detach().numpy(), rtol=0, atol=1e-4, err_msg=k)
