WITH "t0" AS (
  SELECT
    "c"."k0" AS "k0",
    "c"."k1" AS "k1",
    tensor_cast("c"."tensor", 'int32', 'float64') AS "tensor"
  FROM "A" AS "c"
), "t1" AS (
  SELECT
    "c"."k0" AS "i",
    "c"."k1" AS "j",
    "c"."tensor" AS "tensor"
  FROM "t0" AS "c"
), "t2" AS (
  SELECT
    tensor_cast("c"."tensor", 'float32', 'float64') AS "tensor"
  FROM "s" AS "c"
), "t3" AS (
  SELECT
    "c"."tensor" AS "tensor"
  FROM "t2" AS "c"
), "t4" AS (
  SELECT
    "x"."i" AS "i",
    "x"."j" AS "j",
    tensor_einsum(
      'ab,->ba',
      'multiply',
      'sum',
      'float64',
      "x"."tensor",
      [3, 2],
      "y"."tensor",
      CAST([] AS BIGINT[])
    ) AS "tensor"
  FROM "t1" AS "x"
  CROSS JOIN "t3" AS "y"
), "t5" AS (
  SELECT
    "c"."j" AS "k0",
    "c"."i" AS "k1",
    "c"."tensor" AS "tensor"
  FROM "t4" AS "c"
)
SELECT
  *
FROM "t5"
