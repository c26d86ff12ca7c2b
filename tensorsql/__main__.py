"""``python -m tensorsql``: the command line (``tensorsql.cli``)."""

from __future__ import annotations

import sys

from tensorsql.cli import main

sys.exit(main())
