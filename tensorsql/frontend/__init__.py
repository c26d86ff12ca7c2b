"""Front ends: user syntax -> the expression graph (numpy's einsum grammar today; SQL's EINSUM later)."""
