"""tensorsql's intermediate representation: the definitions the front end, the planner glue, the lowering and
SQL generation share. ``tensorsql.ir.ops`` is the one table of operators (joins, aggregations, maps)."""
