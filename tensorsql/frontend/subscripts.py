"""numpy's einsum grammar, parsed into integer labels.

Labels are ints. Letters follow numpy's sublist convention ('A'..'Z' -> 0..25, 'a'..'z' -> 26..51) so
that sorting ints is numpy's implicit-output order; sublist ints may be any non-negative int (beyond
numpy's 52), and so may opt_einsum's non-ASCII symbols (52 + code point); dimensions covered by '...' get
negative labels -E..-1, right-aligned like broadcasting.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorsql.errors import EinsumError, EinsumTypeError, ShapeError


@dataclass(frozen=True)
class Subscripts:
    """A parsed einsum: one label tuple per operand, the output labels, and each label's size."""

    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    sizes: dict[int, int]

    def labels(self) -> list[int]:
        seen: dict[int, None] = {}
        for term in self.inputs:
            seen.update(dict.fromkeys(term))
        return list(seen)


_ELLIPSIS = object()


def letter_label(ch: str) -> int:
    if "A" <= ch <= "Z":
        return ord(ch) - ord("A")
    if "a" <= ch <= "z":
        return ord(ch) - ord("a") + 26
    if ord(ch) >= 128:
        # opt_einsum's symbols beyond the 52 letters (what einsum benchmark collections use): label order
        # follows code points, as opt_einsum sorts them
        return 52 + ord(ch)
    raise EinsumError(
        f"invalid subscript {ch!r}: subscripts must be letters a-z, A-Z, non-ASCII symbols or '...'"
    )


def label_name(label: int) -> str:
    """A SQL-safe, case-insensitively unique column name for a label (DuckDB folds case)."""
    if label < 0:
        return f"e{-label}"
    if label < 26:
        return chr(ord("A") + label) + "_"
    if label < 52:
        return chr(ord("a") + label - 26)
    return f"l{label}"


def _parse_term(term: str, where: str) -> list[object]:
    out: list[object] = []
    i = 0
    while i < len(term):
        if term.startswith("...", i):
            if _ELLIPSIS in out:
                raise EinsumError(f"{where} contains more than one ellipsis '...': {term!r}")
            out.append(_ELLIPSIS)
            i += 3
        elif term[i] == ".":
            raise EinsumError(f"{where} has a '.' that is not part of an ellipsis '...': {term!r}")
        else:
            out.append(letter_label(term[i]))
            i += 1
    return out


def _sublist_items(sub: object, where: str) -> list[object]:
    """The items of a sublist: a list, tuple or other sequence, or a 1-d integer ndarray (as numpy takes)."""
    if isinstance(sub, np.ndarray):
        if sub.ndim != 1 or (sub.size and sub.dtype.kind not in "iu"):
            raise EinsumTypeError(
                f"{where} must be a 1-d array of int labels, got dtype {sub.dtype} and shape {sub.shape}"
            )
        return sub.tolist()
    if isinstance(sub, str | bytes) or not isinstance(sub, Sequence):
        raise EinsumTypeError(f"{where} must be a list or tuple of int labels or Ellipsis, got {sub!r:.80}")
    return list(sub)


def _parse_sublist(sub: object, where: str) -> list[object]:
    out: list[object] = []
    for item in _sublist_items(sub, where):
        if item is Ellipsis:
            if _ELLIPSIS in out:
                raise EinsumError(f"{where} contains more than one Ellipsis")
            out.append(_ELLIPSIS)
        elif isinstance(item, bool | np.bool_) or not hasattr(item, "__index__"):
            raise EinsumTypeError(f"{where}: label {item!r:.80} is not an int (labels are ints or Ellipsis)")
        elif operator.index(item) < 0:  # type: ignore[arg-type]
            raise EinsumError(f"{where}: label {operator.index(item)} is negative")  # type: ignore[arg-type]
        else:
            out.append(operator.index(item))  # type: ignore[arg-type]
    return out


def subscripts_text(spec: object) -> str | None:
    """The subscripts string of a call (bytes decoded, as numpy does), or None for the interleaved form."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, bytes):
        try:
            return spec.decode("ascii")
        except UnicodeDecodeError as exc:
            raise EinsumError(f"subscripts {spec!r:.80} are not ASCII bytes") from exc
    return None


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str, n: int) -> tuple[tuple[tuple[object, ...], ...], tuple[object, ...] | None]:
    """The input and output terms of subscripts ``text`` for ``n`` operands, parsed once per text (a call
    repeated in a loop parses nothing)."""
    spec = text.replace(" ", "")
    if spec.count("->") > 1:
        raise EinsumError(f"subscripts {text!r} contain more than one '->'")
    lhs, arrow, rhs = spec.partition("->")
    if ("-" in lhs or ">" in lhs) or ("-" in rhs or ">" in rhs):
        raise EinsumError(f"subscripts {text!r} have a stray '-' or '>'")
    terms = lhs.split(",")
    if len(terms) != n:
        raise EinsumError(f"subscripts {text!r} name {len(terms)} operand(s) but {n} were given")
    inputs = tuple(tuple(_parse_term(t, f"operand {i}")) for i, t in enumerate(terms))
    output = tuple(_parse_term(rhs, "output")) if arrow else None
    return inputs, output


def split_args(args: Sequence[object]) -> tuple[list[list[object]], list[object] | None, list[object]]:
    """Split ``einsum``'s positional arguments into (input terms, output term or None, operands)."""
    if not args:
        raise EinsumError("einsum needs subscripts and at least one operand")
    text = subscripts_text(args[0])
    if text is not None:
        operands = list(args[1:])
        inputs, output = _parse_text(text, len(operands))
        return [list(t) for t in inputs], None if output is None else list(output), operands
    # interleaved form: op0, sub0, op1, sub1, ..., [output]
    if len(args) == 1:
        raise EinsumError("einsum needs subscripts and at least one operand (got one operand, no sublist)")
    rest = list(args)
    out_term = None
    if len(rest) % 2 == 1:
        out_term = _parse_sublist(rest.pop(), "output sublist")
    operands = rest[0::2]
    inputs = [_parse_sublist(s, f"sublist of operand {i}") for i, s in enumerate(rest[1::2])]
    return inputs, out_term, operands


def parse(
    inputs: list[list[object]], output: list[object] | None, shapes: Sequence[tuple[int, ...]]
) -> Subscripts:
    """Resolve ellipses, implicit output and label sizes against the operands' shapes (numpy rules)."""
    ell_rank = 0
    for i, (term, shape) in enumerate(zip(inputs, shapes, strict=True)):
        n_explicit = sum(1 for t in term if t is not _ELLIPSIS)
        if _ELLIPSIS in term:
            if n_explicit > len(shape):
                raise EinsumError(
                    f"operand {i} has {len(shape)} dimension(s) but its subscripts name {n_explicit}"
                )
            ell_rank = max(ell_rank, len(shape) - n_explicit)
        elif n_explicit != len(shape):
            raise EinsumError(
                f"operand {i} has {len(shape)} dimension(s) but its subscripts name {n_explicit}"
            )
    ell_labels = list(range(-ell_rank, 0))

    def expand(term: list[object], ndim: int) -> tuple[int, ...]:
        out: list[int] = []
        n_explicit = sum(1 for t in term if t is not _ELLIPSIS)
        for t in term:
            if t is _ELLIPSIS:
                k = ndim - n_explicit
                out.extend(ell_labels[len(ell_labels) - k :] if k else [])
            else:
                out.append(t)  # type: ignore[arg-type]
        return tuple(out)

    in_labels = tuple(expand(t, len(s)) for t, s in zip(inputs, shapes, strict=True))

    sizes: dict[int, int] = {}
    for i, (labels, shape) in enumerate(zip(in_labels, shapes, strict=True)):
        local: dict[int, int] = {}
        for label, n in zip(labels, shape, strict=True):
            if label in local and local[label] != n:
                raise EinsumError(
                    f"operand {i} repeats label {label_name(label)!r} on dimensions of different sizes "
                    f"({local[label]} != {n})"
                )
            local[label] = n
            prev = sizes.get(label)
            if prev is None or prev == 1:
                sizes[label] = n
            elif n not in (1, prev):
                raise EinsumError(
                    f"label {label_name(label)!r} has size {n} in operand {i} but size {prev} elsewhere "
                    "(sizes must match or be 1 to broadcast)"
                )

    counts: dict[int, int] = {}
    for labels in in_labels:
        for label in labels:
            counts[label] = counts.get(label, 0) + 1
    if output is None:
        out = tuple(ell_labels) + tuple(sorted(x for x, c in counts.items() if c == 1 and x >= 0))
    else:
        if _ELLIPSIS not in output and ell_rank:
            raise EinsumError(
                "the operands have dimensions under '...' but the output has no '...' to keep them"
            )
        out = expand(output, len(ell_labels) + sum(1 for t in output if t is not _ELLIPSIS))
        if len(set(out)) != len(out):
            raise EinsumError(f"output subscripts repeat a label: {[label_name(x) for x in out]}")
        for label in out:
            if label not in counts:
                raise EinsumError(f"output label {label_name(label)!r} does not appear in any operand")
    return Subscripts(inputs=in_labels, output=out, sizes=sizes)


def label_parts(blocks: dict[object, int], sizes: dict[int, int]) -> dict[int, int]:
    """``blocks={'i': 4, 'k': 2}`` (letters, or ints in the sublist form) -> parts per int label."""
    if not isinstance(blocks, dict):
        raise ShapeError(f"blocks must be a dict label -> parts, got {blocks!r}")
    out: dict[int, int] = {}
    for key, parts in blocks.items():
        label = letter_label(key) if isinstance(key, str) and len(key) == 1 else key
        if not isinstance(label, int) or label not in sizes:
            raise EinsumError(f"blocks names label {key!r}, which is not in the einsum")
        if not isinstance(parts, int) or parts < 1 or parts > max(1, sizes[label]):
            raise ShapeError(f"blocks[{key!r}]={parts!r} must be an int in 1..{max(1, sizes[label])}")
        out[label] = parts
    return out
