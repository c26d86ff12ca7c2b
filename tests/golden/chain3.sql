WITH "t0" AS (
  SELECT
    "c"."k0" AS "k",
    "c"."k1" AS "l",
    "c"."tensor" AS "tensor"
  FROM "C" AS "c"
), "t1" AS (
  SELECT
    "c"."k0" AS "i",
    "c"."k1" AS "j",
    "c"."tensor" AS "tensor"
  FROM "A" AS "c"
), "t2" AS (
  SELECT
    "c"."k0" AS "j",
    "c"."k1" AS "k",
    "c"."tensor" AS "tensor"
  FROM "B" AS "c"
), "t3" AS (
  SELECT
    "x"."i" AS "i",
    "y"."k" AS "k",
    tensor_einsum_agg('ab,bc->ac', 'multiply', 'sum', 'float64', "x"."tensor", [4, 40], "y"."tensor", [40, 3]) AS "tensor"
  FROM "t1" AS "x"
  JOIN "t2" AS "y"
    ON "x"."j" = "y"."j"
  GROUP BY
    "x"."i",
    "y"."k"
), "t4" AS (
  SELECT
    "c"."i" AS "k0",
    "c"."k" AS "k1",
    "c"."tensor" AS "tensor"
  FROM "t3" AS "c"
), "t5" AS (
  SELECT
    "c"."k0" AS "i",
    "c"."k1" AS "k",
    "c"."tensor" AS "tensor"
  FROM "t4" AS "c"
), "t6" AS (
  SELECT
    "y"."i" AS "i",
    "x"."l" AS "l",
    tensor_einsum_agg('ab,ca->cb', 'multiply', 'sum', 'float64', "x"."tensor", [3, 50], "y"."tensor", [4, 3]) AS "tensor"
  FROM "t0" AS "x"
  JOIN "t5" AS "y"
    ON "x"."k" = "y"."k"
  GROUP BY
    "y"."i",
    "x"."l"
), "t7" AS (
  SELECT
    "c"."i" AS "k0",
    "c"."l" AS "k1",
    "c"."tensor" AS "tensor"
  FROM "t6" AS "c"
)
SELECT
  *
FROM "t7"
