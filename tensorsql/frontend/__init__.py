"""Front ends: user syntax -> the expression graph. numpy's einsum grammar (subscripts, numpy), SQL with
tensor table functions (sql), wide tables and id columns (wide, ids), and the SQL row checks they share
(rowcheck)."""

from __future__ import annotations
