WITH "t0" AS (
  SELECT
    "c"."k0" AS "i",
    "c"."tensor" AS "tensor"
  FROM "M" AS "c"
  WHERE
    "c"."k0" = "c"."k1"
), "t1" AS (
  SELECT
    tensor_sum(tensor_einsum1('aa->', 'sum', 'float64', "c"."tensor", [3, 3]), 'float64') AS "tensor"
  FROM "t0" AS "c"
), "t2" AS (
  SELECT
    "c"."tensor" AS "tensor"
  FROM "t1" AS "c"
)
SELECT
  *
FROM "t2"
