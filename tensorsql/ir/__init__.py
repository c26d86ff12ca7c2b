"""The intermediate representations, pure data (no engine, no I/O): the expression graph (expr), block
arithmetic and partitionings (blocking), the tensor-relational algebra (tra), and the one table of operators
(ops: joins, aggregations, maps) that the front end, the planner glue, lowering and SQL generation share."""

from __future__ import annotations
