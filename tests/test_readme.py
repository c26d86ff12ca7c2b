"""Every ```python block of the README runs, in order, in one namespace: a documented call cannot raise
TypeError (or anything else) without this test failing."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 8


def test_every_python_block_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # blocks create database files
    rng = np.random.default_rng(0)
    ns: dict[str, object] = {
        "__name__": "__main__",  # the cluster block's main guard: it starts a LocalCluster
        "np": np,
        "c": rng.standard_normal((100, 50)),
        "X": rng.standard_normal((4, 6)),
        "Y": rng.standard_normal((6, 4)),
    }
    for i, block in enumerate(BLOCKS):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), ns)
        except Exception as exc:
            pytest.fail(f"README python block {i + 1} raised {type(exc).__name__}: {exc}\n{block}")
    for name in ("s",):
        ns[name].close()  # type: ignore[attr-defined]
