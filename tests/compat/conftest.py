"""numpy's and opt_einsum's own einsum tests, run against tensorsql (docs "Einsum and numpy compatibility").

The one place that says which upstream tests do not apply to tensorsql and why (``SKIPS``), and which part of
opt_einsum's large parametrizations runs by default (``SAMPLE``; ``TENSORSQL_COMPAT_FULL=1`` runs them all).
"""

from __future__ import annotations

import os
import zlib

import pytest
import upstream

#: stub module -> {test name prefix (after the module's '::'): why tensorsql does not run it}
_OBJECT = (
    "object arrays: tensorsql computes numbers in its kernels, not Python objects (a DTypeError says so; "
    "dtype= converts them first)"
)
_LONGDOUBLE = (
    "longdouble/clongdouble: the kernels compute at most float64/complex128, so tensorsql raises a "
    "DTypeError rather than round silently"
)
_PATH_ONLY = "exercises opt_einsum's own contract_path or path utilities only: nothing of tensorsql's runs"

SKIPS: dict[str, dict[str, str]] = {
    "test_numpy_einsum.py": {
        "TestEinsum::test_einsum_views": (
            "numpy internals: einsum returns views of its operands (b.base is a.base); tensorsql's results "
            "are new arrays computed in DuckDB"
        ),
        "TestEinsum::test_einsum_sums_longdouble": _LONGDOUBLE,
        "TestEinsum::test_einsum_sums_clongdouble": _LONGDOUBLE,
        "TestEinsum::test_different_paths[g]": _LONGDOUBLE,
        "TestEinsum::test_different_paths[G]": _LONGDOUBLE,
        "TestEinsum::test_einsum_sums_object": _OBJECT,
        "TestEinsum::test_einsum_object_errors": _OBJECT,
        "TestEinsum::test_object_loop": _OBJECT,
        "TestEinsum::test_subscript_range": (
            "more than 52 labels: numpy raises ValueError for sublist label 52, tensorsql takes any "
            "non-negative int label"
        ),
        "TestEinsum::test_einsum_0d_out": "numpy's optimized path writes a float64 result into an int64 out= "
        "without applying casting='safe' (its unoptimized einsum raises TypeError, as tensorsql does)",
        "TestEinsumPath::test_long_paths": "path choice: opt_einsum's greedy/optimal choose other (equally "
        "valid) orders than numpy's own implementations",
        "TestEinsumPath::test_edge_paths": "path choice: opt_einsum's greedy/optimal choose other (equally "
        "valid) orders than numpy's own implementations",
    },
    "test_opt_einsum_contract.py": {
        "test_printing": _PATH_ONLY,
        "test_linear_vs_ssa": _PATH_ONLY,
        "test_contract_path_supply_shapes": _PATH_ONLY,
    },
    "test_opt_einsum_edge_cases.py": {
        "test_pathinfo_for_empty_contraction": _PATH_ONLY,
        "test_can_blas_on_healed_broadcast_dimensions": (
            "opt_einsum internals: its ContractExpression's contraction_list and BLAS choice per step"
        ),
        "test_contract_expression_checks": (
            "opt_einsum's own error wording ('Internal error while evaluating `ContractExpression`') and its "
            "refusal of optimize=False; tensorsql raises a ShapeError (a ValueError) in its own words and "
            "accepts optimize=False"
        ),
    },
    "test_opt_einsum_input.py": {
        "test_value_errors[contract_path]": _PATH_ONLY,
        "test_hashable_object_input_format": (
            "opt_einsum's extension of the interleaved form to any hashable label ('left', 'bond1'); numpy "
            "and tensorsql take int labels"
        ),
    },
}

#: stub module -> {test name: what tensorsql still lacks}; run as strict xfails, so a fix makes them fail
#: until they are taken off this list
XFAILS: dict[str, dict[str, str]] = {}  # upstream tests expected to fail, with the reason (none now)

#: stub module -> (test function -> keep 1 in N of its parametrized cases, chosen by a hash of the case id)
SAMPLE: dict[str, dict[str, int]] = {
    "test_opt_einsum_contract.py": {
        "test_compare": 8,
        "test_compare_greek": 8,
        "test_compare_blas": 8,
        "test_compare_blas_greek": 8,
        "test_contract_expressions": 16,
    },
}


def _skip_reason(module: str, name: str) -> str | None:
    for prefix, reason in SKIPS.get(module, {}).items():
        if name == prefix or name.startswith((prefix + "[", prefix + "::")):
            return reason
    return None


def _sampled_out(module: str, name: str) -> bool:
    func, _, case = name.partition("[")
    keep = SAMPLE.get(module, {}).get(func)
    if keep is None or os.environ.get("TENSORSQL_COMPAT_FULL") == "1":
        return False
    return zlib.crc32(case.encode()) % keep != 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        module, _, name = item.nodeid.rpartition("/")[2].partition("::")
        if module not in SKIPS:
            kept.append(item)
            continue
        if _sampled_out(module, name):
            dropped.append(item)
            continue
        reason = _skip_reason(module, name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        missing = XFAILS.get(module, {}).get(name)
        if missing is not None:
            item.add_marker(pytest.mark.xfail(reason=missing, strict=True))
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if upstream.STATS["compared"]:
        terminalreporter.write_line(
            f"upstream einsum suites: {upstream.STATS['compared']} tensorsql results compared with "
            f"numpy/opt_einsum, {upstream.STATS['mismatched']} different"
        )
