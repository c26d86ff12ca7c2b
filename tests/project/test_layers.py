"""Imports flow one way: no module of tensorsql, planner or udf_kernels imports one that imports it back, and
no module of tensorsql imports one of a layer above its own. Every import counts, at module level or inside a
function (a lazy import is still a dependency); only imports under ``if TYPE_CHECKING:`` are exempt. The
graph is read from the sources with ``ast``, so nothing here runs the modules."""

from __future__ import annotations

import ast
import itertools
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("tensorsql", "planner", "udf_kernels")

#: tensorsql's layers, lowest first: a module may import its own layer and those below, never one above.
#: A name stands for that module and everything under it (``tensorsql.ir``: the package and its modules),
#: except ``tensorsql``, which is the package's ``__init__`` alone: the public facade, which nothing below it
#: imports. planner and udf_kernels are libraries beneath everything and import nothing of tensorsql.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("libraries", ("planner", "udf_kernels")),
    ("base", ("tensorsql.errors", "tensorsql.dtypes", "tensorsql.metadata", "tensorsql.sqlexpr")),
    ("ir", ("tensorsql.ir",)),
    ("frontend", ("tensorsql.frontend",)),
    ("compile", ("tensorsql.compile",)),
    ("backends", ("tensorsql.backends",)),
    (
        "session",
        (
            "tensorsql.session",
            "tensorsql.relation",
            "tensorsql.operators",
            "tensorsql.arguments",
            "tensorsql.compiled",
            "tensorsql.ingest",
            "tensorsql.lazy",
            "tensorsql.stored",
            "tensorsql.session_sql",
            "tensorsql.sqlpolicy",
        ),
    ),
    ("api", ("tensorsql.api", "tensorsql.autodiff")),
    ("ml", ("tensorsql.ml",)),
    ("programs", ("tensorsql.cli", "tensorsql.calibrate", "tensorsql.__main__")),
    ("facade", ("tensorsql",)),
    # the demo is written as a user's program: it imports the package the way users do
    ("demo", ("tensorsql.demo",)),
)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, but those under ``if TYPE_CHECKING:`` (its ``else`` counts)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        visit(node)

    visit(tree)
    return found


def _known(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The project module ``name`` is, or lies in (its longest prefix that is one); None outside."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, pathlib.Path]) -> list[str]:
    """The project modules an import statement of ``module`` reaches: ``from a import b`` reaches ``a.b``
    where that is a module, else ``a``; ``from . import b`` is resolved against ``module``'s package."""
    if isinstance(node, ast.Import):
        return [t for a in node.names if (t := _known(a.name, modules))]
    if node.level:
        base = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        target = sub if sub in modules else _known(base, modules)
        if target:
            out.append(target)
    return out


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported project module: the line of its first import}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for module, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(module, node, modules):
                if target != module:
                    graph[module].setdefault(target, node.lineno)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each as one cycle through all
    of its members' first edges found: ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return [_a_cycle(graph, c) for c in components]


def _a_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, by breadth-first search inside it."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in component:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(component)


def _shown(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def _layer(module: str) -> int | None:
    """The index in ``LAYERS`` of the module's layer (the longest name that covers it); None if none does."""
    best: tuple[int, int] | None = None
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            covers = module == name or (name != "tensorsql" and module.startswith(name + "."))
            if covers and (best is None or len(name) > best[1]):
                best = (i, len(name))
    return None if best is None else best[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return _graph()


def test_tensorsql_and_planner_import_without_cycles(graph):
    cycles = [c for c in _cycles(graph) if not any(m.startswith("udf_kernels") for m in c)]
    assert not cycles, "import cycles:\n" + "\n".join(_shown(graph, c) for c in cycles)


def test_udf_kernels_imports_without_cycles(graph):
    cycles = [c for c in _cycles(graph) if any(m.startswith("udf_kernels") for m in c)]
    assert not cycles, "import cycles:\n" + "\n".join(_shown(graph, c) for c in cycles)


def test_every_tensorsql_module_has_a_layer(graph):
    loose = sorted(m for m in graph if _layer(m) is None)
    assert not loose, f"modules in no layer of LAYERS (place each deliberately): {loose}"


def test_no_module_imports_a_layer_above_its_own(graph):
    upward = []
    for module, targets in sorted(graph.items()):
        mine = _layer(module)
        for target, line in sorted(targets.items()):
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(
                    f"{module} ({LAYERS[mine][0]}), line {line}, imports {target} ({LAYERS[theirs][0]})"
                )
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_the_rules_see_every_kind_of_import():
    """The reader itself: lazy imports count, TYPE_CHECKING ones do not, ``from a import b`` reaches a
    submodule, relative imports resolve."""
    modules = {m: ROOT / "x.py" for m in ("p", "p.a", "p.b", "p.c", "p.d")}
    modules["p"] = ROOT / "p" / "__init__.py"
    source = """
from typing import TYPE_CHECKING
from p import b
if TYPE_CHECKING:
    from p import c
def f():
    from . import d
    import p.a
"""
    nodes = _imports(ast.parse(source))
    reached = {t for node in nodes for t in _targets("p.a", node, modules)}
    assert reached == {"p.b", "p.d", "p.a"}
    assert _cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}) == [["a", "b", "c", "a"]]


def test_import_tensorsql_registers_what_the_sql_surface_needs():
    """The SQL front end sits below ``api`` and ``ml``: they register softmax and the model loader as they
    are imported, and ``import tensorsql`` alone imports them."""
    code = (
        "import tensorsql\n"
        "from tensorsql.frontend import sql\n"
        "print(sorted(sql.PROVIDED))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["['model',", "'softmax']"]
