"""Every ```python block of README.md and docs/**/*.md runs, as written, in a fresh namespace.

Conventions (the last non-blank line before a fence is its marker, an HTML comment that the docs do not show):

- ``<!-- continues -->``: the block runs in the namespace (and the working directory) of the block before it
  in the same file, so a page can build an example up step by step;
- ``<!-- skip: <reason> -->``: the block is not run (only for what this machine may lack, such as a CUDA
  GPU); the reason is reported;
- blocks that are not Python (```bash, ```sql, ```text) are never run.

Each block runs in a temporary working directory (blocks may create database files), with ``__name__`` set
to ``"__main__"`` (the cluster example's main guard starts a Dask LocalCluster). Sessions a chain of blocks
leaves open are closed when it ends. The block's id (``docs/user-guide/sql.md:3``: the third Python block
of that file) names the failure.
"""

from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*(continues|skip:\s*(?P<reason>.*?))\s*-->\s*$")


@dataclass
class Block:
    path: str
    number: int  # 1-based among the file's python blocks
    code: str
    continues: bool
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.number}"


def doc_files() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: pathlib.Path) -> list[Block]:
    text = path.read_text()
    rel = path.relative_to(ROOT).as_posix()
    out: list[Block] = []
    for m in FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        before = [line for line in text[: m.start()].splitlines() if line.strip()]
        marker = MARKER.search(before[-1]) if before else None
        continues = bool(marker and marker.group(1) == "continues")
        skip = marker.group("reason") if marker and marker.group("reason") is not None else None
        out.append(Block(rel, len(out) + 1, m.group(2), continues, skip))
    return out


BLOCKS = [b for f in doc_files() for b in blocks_of(f)]


def test_the_docs_have_python_blocks_and_skip_only_with_a_reason():
    assert len(BLOCKS) >= 20
    assert any(b.path == "README.md" for b in BLOCKS)
    skipped = [b for b in BLOCKS if b.skip is not None]
    for b in skipped:
        assert b.skip.strip(), f"{b.id}: a skip marker needs its reason"
    for b in BLOCKS:
        if b.continues:
            assert b.number > 1, f"{b.id} continues, but it is the first python block of its file"
    print(f"\n{len(BLOCKS)} python blocks, {len(skipped)} skipped:")
    for b in skipped:
        print(f"  {b.id}: {b.skip}")


class _Chain:
    """The namespace and working directory of the blocks that run in turn in one file."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.ns: dict[str, object] = {}
        self.cwd: pathlib.Path | None = None
        self.failed = False

    def close(self) -> None:
        import tensorsql as ts

        for value in list(self.ns.values()):
            if isinstance(value, ts.Session) and not value.closed:
                value.close()
        self.ns = {}


@pytest.fixture(scope="module")
def chain():
    state = _Chain()
    yield state
    state.close()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs(block: Block, chain: _Chain, tmp_path: pathlib.Path):
    if block.skip is not None:
        pytest.skip(block.skip)
    start_new = not (block.continues and chain.key == f"{block.path}:{block.number - 1}")
    if block.continues and start_new:
        pytest.skip("the block it continues did not run (run the whole file's blocks)")
    if start_new:
        chain.close()
        chain.ns = {"__name__": "__main__"}
        chain.cwd = tmp_path
        chain.failed = False
    elif chain.failed:
        pytest.fail(f"{block.id}: the block it continues failed")
    chain.key = block.id
    old = os.getcwd()
    os.chdir(chain.cwd)
    try:
        exec(compile(block.code, block.id, "exec"), chain.ns)
    except BaseException:
        chain.failed = True
        raise
    finally:
        os.chdir(old)
