WITH "t0" AS (
  SELECT
    "c"."k0" AS "i",
    "c"."k1" AS "j",
    "c"."tensor" AS "tensor"
  FROM "A" AS "c"
), "t1" AS (
  SELECT
    "c"."k0" AS "j",
    "c"."k1" AS "k",
    "c"."tensor" AS "tensor"
  FROM "B" AS "c"
), "t2" AS (
  SELECT
    "x"."i" AS "i",
    "y"."k" AS "k",
    tensor_einsum_agg('ab,bc->ac', 'multiply', 'sum', 'float64', "x"."tensor", [4, 3], "y"."tensor", [3, 5]) AS "tensor"
  FROM "t0" AS "x"
  JOIN "t1" AS "y"
    ON "x"."j" = "y"."j"
  GROUP BY
    "x"."i",
    "y"."k"
), "t3" AS (
  SELECT
    "c"."i" AS "k0",
    "c"."k" AS "k1",
    "c"."tensor" AS "tensor"
  FROM "t2" AS "c"
)
SELECT
  *
FROM "t3"
