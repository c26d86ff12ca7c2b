"""opt_einsum's own ``tests/test_input.py``, loaded from the installed opt_einsum, with
``contract`` bound to ``ts.einsum`` and ``contract_expression`` to ``ts.contract_expression`` (see
upstream.py and conftest.py)."""

from __future__ import annotations

import upstream

globals().update(upstream.opt_einsum_suite("test_input.py"))
