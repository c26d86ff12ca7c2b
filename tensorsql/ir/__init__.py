"""The intermediate representations: the expression graph (expr), block arithmetic and partitionings
(blocking), and the tensor-relational algebra (tra). Pure data: no engine, no I/O."""
