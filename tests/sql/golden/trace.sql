WITH "t0" AS (
  SELECT
    tensor_sum(tensor_einsum1('aa->', 'sum', 'float64', "c"."tensor", [3, 3]), 'float64') AS "tensor"
  FROM "M" AS "c"
  WHERE
    "c"."k0" = "c"."k1"
)
SELECT
  *
FROM "t0"
