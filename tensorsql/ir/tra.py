"""The tensor-relational algebra: immutable relational operators over (keys, blob) relations.

A TRA relation has one INTEGER key column per key label and a ``tensor`` BLOB whose dimensions are
``blob`` labels (a label may repeat in ``blob`` for a diagonal block). Every blob label is also a key,
so each row's block shape follows from its keys: ``min(block, size - block * key)`` per label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from tensorsql.ir import blocking


@dataclass(frozen=True)
class Schema:
    keys: tuple[str, ...]
    blob: tuple[str, ...]
    sizes: dict[str, int] = field(hash=False)
    blocks: dict[str, int] = field(hash=False)
    dtype: str

    def nblocks(self, label: str) -> int:
        return blocking.nblocks(self.sizes[label], self.blocks[label])


def positional(shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str) -> Schema:
    """The schema of a stored tensor relation: keys k0..k{r-1} in dimension order."""
    keys = tuple(f"k{i}" for i in range(len(shape)))
    return Schema(
        keys=keys,
        blob=keys,
        sizes=dict(zip(keys, shape, strict=True)),
        blocks=dict(zip(keys, block_shape, strict=True)),
        dtype=dtype,
    )


@dataclass(frozen=True, eq=False)
class Rel:
    schema: Schema


@dataclass(frozen=True, eq=False)
class Scan(Rel):
    """A stored relation (a table or view the executor knows by name); ``complete``: known to hold every
    block (``expr.Source.complete``)."""

    table: str
    complete: bool = False


@dataclass(frozen=True, eq=False)
class Input(Rel):
    """Operand ``index`` of the plan (``Plan.operands``), in positional keys: data the executor binds at run
    time (an uploaded view, or an array lent to the query), so one plan serves many calls."""

    index: int
    name: str


#: how a Join pairs its sides' blocks (set by ``compile.rewrite.choose_joins``, read by SQL generation):
#: hash = equi-join on the shared keys (a cross join when there are none); side_by_side = both sides are one
#: block, read by position; repeat_left / repeat_right = that side is one small block, repeated beside every
#: row of the other side
JOIN_METHODS = ("hash", "side_by_side", "repeat_left", "repeat_right")


@dataclass(frozen=True, eq=False)
class Relabel(Rel):
    """Positional keys -> labels; a repeated label keeps only blocks whose keys agree (diagonal)."""

    child: Rel
    labels: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Repartition(Rel):
    """Same tensor, new block sizes (``schema.blocks``): slice overlapping blocks and reassemble.

    ``diagonal``: groups of key positions that a repeated label ties (a Relabel above keeps only blocks whose
    keys agree along them): only those diagonal blocks are made, never the blocks' cross product.
    """

    child: Rel
    diagonal: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, eq=False)
class Join(Rel):
    """Equi-join on shared key labels; each matched pair becomes ``join``/``agg`` of the two blocks."""

    left: Rel
    right: Rel
    join: str
    agg: str
    #: physical choices, fixed by rewrite passes before SQL generation (see JOIN_METHODS)
    method: str = "hash"
    #: the left side computes its block shapes below the join (``tensor_pin``: no copy of each joined pair)
    pin: bool = False
    #: the output may hold padding rows (NULL keys and block) that every consumer skips
    padded: bool = False


@dataclass(frozen=True, eq=False)
class Aggregate(Rel):
    """Group by ``schema.keys`` and combine the blocks of each group element-wise with ``agg``."""

    child: Rel
    agg: str


@dataclass(frozen=True, eq=False)
class Unary(Rel):
    """A per-block unary einsum (transpose, diagonal, in-block reduction) from child.blob to schema.blob."""

    child: Rel
    agg: str


@dataclass(frozen=True, eq=False)
class MapBlocks(Rel):
    child: Rel
    fn: str
    param: float | None


@dataclass(frozen=True, eq=False)
class CastBlocks(Rel):
    child: Rel


@dataclass(frozen=True, eq=False)
class Densify(Rel):
    """Every block of the grid: the child's block where it has one, a zero block where it does not (an
    absent block of a stored relation). Put before a step that must see those zeros (``compile.lower``): a
    map whose value at zero is not zero (``exp``, ``sigmoid``, ...), a join other than multiply, an
    aggregation other than sum. Each runs on the blocks that are there, so without this an absent block
    would stay absent (zeros) instead of f(0), x + 0 or max(.., 0). Positional, same schema as the child."""

    child: Rel


@dataclass(frozen=True, eq=False)
class Positional(Rel):
    """Rename the keys back to k0..k{r-1} in blob order: the boundary between expression nodes."""

    child: Rel


@dataclass(frozen=True, eq=False)
class Fused(Rel):
    """A tree of multiply/sum contractions whose every tensor is one block, as one kernel call
    (``tensor_einsum_path``) over its single-block inputs side by side: one query step instead of a
    join and a group-by per contraction. ``steps`` are (operand, operand, labels of the first, labels of the
    second, output labels); operands number the children first, then the steps' results; the last step's
    result is the output (positional keys). Labels are per step."""

    children: tuple[Rel, ...]
    steps: tuple[tuple[int, int, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...]


@dataclass(frozen=True, eq=False)
class Restrict(Rel):
    """The child's rows whose keys lie in ``ranges`` ((key, first, last) block keys, inclusive): one wave of
    a plan run in pieces under a memory limit (``backends.duckdb.waves``). Same schema as the child."""

    child: Rel
    ranges: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, eq=False)
class Slice(Rel):
    """Basic indexing of a positional relation (``expr.Slice``): child dimension d read at ``start[d] +
    step[d] * t`` for ``t < count[d]``, dropped where not ``keep``. The output is positional over the kept
    dimensions, in ``schema.blocks``: each child block is cut into the pieces it holds of each output block
    (a strided ``tensor_slice_strided``), and the pieces of an output block assembled."""

    child: Rel
    start: tuple[int, ...]
    count: tuple[int, ...]
    step: tuple[int, ...]
    keep: tuple[bool, ...]

    def pieces(self, d: int) -> list[tuple[int, int, int, int, int]]:
        """Along child dimension ``d``: (child block, output block, first element in the child block,
        elements, offset in the output block) of every piece, in child-block order."""
        c = self.child.schema
        lab = c.keys[d]
        size, bs = c.sizes[lab], c.blocks[lab]
        start, count, step = self.start[d], self.count[d], self.step[d]
        bt = self.schema.blocks[self.schema.keys[self.out_dim(d)]] if self.keep[d] else 1
        out: list[tuple[int, int, int, int, int]] = []
        t = 0
        while t < count:
            src = start + step * t
            block = src // bs
            lo, hi = block * bs, min((block + 1) * bs, size)
            # elements t.. that stay in this child block and this output block
            run = (hi - 1 - src) // step + 1 if step > 0 else (src - lo) // -step + 1
            run = min(run, count - t, bt - t % bt)
            out.append((block, t // bt, src - lo, run, t % bt))
            t += run
        return sorted(out)

    def out_dim(self, d: int) -> int:
        """The output dimension of kept child dimension ``d``."""
        return sum(self.keep[:d])


def inputs(rel: Rel) -> tuple[Rel, ...]:
    if isinstance(rel, Scan | Input):
        return ()
    if isinstance(rel, Fused):
        return rel.children
    if isinstance(rel, Join):
        return (rel.left, rel.right)
    if isinstance(
        rel,
        Relabel
        | Repartition
        | Aggregate
        | Unary
        | MapBlocks
        | CastBlocks
        | Positional
        | Restrict
        | Slice
        | Densify,
    ):
        return (rel.child,)
    raise TypeError(f"unhandled TRA node {type(rel).__name__}")


def with_inputs(rel: Rel, new: tuple[Rel, ...]) -> Rel:
    """``rel`` over ``new`` inputs (in ``inputs`` order); ``rel`` itself when they are the same nodes."""
    old = inputs(rel)
    if len(new) != len(old):
        raise TypeError(f"{type(rel).__name__} takes {len(old)} inputs, got {len(new)}")
    if all(a is b for a, b in zip(old, new, strict=True)):
        return rel
    if isinstance(rel, Fused):
        return replace(rel, children=tuple(new))
    if isinstance(rel, Join):
        return replace(rel, left=new[0], right=new[1])
    return replace(rel, child=new[0])


def counted(rel: Rel) -> bool:
    """A side whose rows are the stored relation's rows (SQL generation counts them for a repeat)."""
    return isinstance(rel, Scan | Input) or (
        isinstance(rel, Relabel) and isinstance(rel.child, Scan | Input)
    )


def nodes(root: Rel, stop: Callable[[Rel], bool] | None = None) -> Iterator[Rel]:
    """Every relation of the plan, once each (a DAG: a shared input is visited once), consumers first;
    ``stop``: relations whose inputs are not visited (they are yielded themselves)."""
    seen: set[Rel] = set()
    stack = [root]
    while stack:
        r = stack.pop()
        if r in seen:
            continue
        seen.add(r)
        yield r
        if stop is None or not stop(r):
            stack.extend(inputs(r))


def one_row(root: Rel) -> bool:
    """Whether every relation of the plan is one block (one row each): a plan a statement computes as one
    row of kernel calls, where every operand is read exactly once."""
    return all(rel.schema.nblocks(k) == 1 for rel in nodes(root) for k in rel.schema.keys)


def may_lack_blocks(rel: Rel) -> bool:
    """Whether a relation may miss blocks: it reads a stored relation (a user's table may be sparse) other
    than through a ``Densify``. Arrays, a complete stand-in, a filled grid and what is computed from them
    alone have every block (a step over inputs that have every block makes every block)."""
    seen: set[Rel] = set()
    stack = [rel]
    while stack:
        r = stack.pop()
        if r in seen or isinstance(r, Densify):
            continue
        if isinstance(r, Scan) and not r.complete:
            return True
        seen.add(r)
        stack.extend(inputs(r))
    return False


def may_pad(rel: Rel) -> bool:
    """Whether any step may leave padding rows (the final SELECT then drops them)."""
    return any(isinstance(r, Fused) or (isinstance(r, Join) and r.padded) for r in nodes(rel))


def render(rel: Rel) -> str:
    """An indented tree of the plan, for explain()."""
    lines: list[str] = []

    def detail(r: Rel) -> str:
        s = r.schema
        blocks = ",".join(f"{k}:{s.blocks[k]}" for k in s.keys)
        base = f"keys=({', '.join(s.keys)}) blob=[{','.join(s.blob)}] blocks=({blocks}) {s.dtype}"
        if isinstance(r, Scan):
            return f"Scan {r.table} {base}"
        if isinstance(r, Relabel):
            return f"Relabel -> ({', '.join(r.labels)}) {base}"
        if isinstance(r, Input):
            return f"Input #{r.index} {r.name} {base}"
        if isinstance(r, Join):
            phys = f" method={r.method}" + (" pin" if r.pin else "") + (" padded" if r.padded else "")
            return f"Join join={r.join} agg={r.agg}{phys} {base}"
        if isinstance(r, Aggregate | Unary):
            return f"{type(r).__name__} agg={r.agg} {base}"
        if isinstance(r, MapBlocks):
            return f"Map {r.fn}{'' if r.param is None else f'({r.param})'} {base}"
        if isinstance(r, Repartition) and r.diagonal:
            tied = " ".join("=".join(s.keys[i] for i in g) for g in r.diagonal)
            return f"Repartition diagonal({tied}) {base}"
        if isinstance(r, Slice):
            dims = ",".join(
                f"{a}:{b}:{n}" if keep else f"{a}(dropped)"
                for a, n, b, keep in zip(r.start, r.count, r.step, r.keep, strict=True)
            )
            return f"Slice start:step:count [{dims}] {base}"
        if isinstance(r, Restrict):
            return f"Restrict {' '.join(f'{k}:{lo}..{hi}' for k, lo, hi in r.ranges)} {base}"
        if isinstance(r, Fused):
            steps = "; ".join(
                f"{i},{j}:{','.join(x)}*{','.join(y)}->{','.join(z)}" for i, j, x, y, z in r.steps
            )
            return f"Fused steps=[{steps}] {base}"
        return f"{type(r).__name__} {base}"

    seen: dict[Rel, int] = {}

    def walk(r: Rel, depth: int) -> None:
        if r in seen:  # a DAG: a shared input is computed once, printed once
            lines.append("  " * depth + f"-> #{seen[r]} (shared)")
            return
        seen[r] = len(seen) + 1
        lines.append("  " * depth + f"#{seen[r]} " + detail(r))
        for c in inputs(r):
            walk(c, depth + 1)

    walk(rel, 0)
    return "\n".join(lines)
