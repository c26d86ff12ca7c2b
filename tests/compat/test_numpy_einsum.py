"""numpy's own ``test_einsum.py``, loaded from the installed numpy, with ``np.einsum`` and
``np.einsum_path`` bound to ``ts.einsum`` and ``ts.einsum_path`` (see upstream.py; the tests that check numpy
internals are skipped in conftest.py, with the reason for each)."""

from __future__ import annotations

import upstream

globals().update(upstream.numpy_suite())
