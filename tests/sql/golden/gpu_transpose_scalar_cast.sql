WITH "t0" AS (
  SELECT
    "c"."k0" AS "k0",
    "c"."k1" AS "k1",
    tensor_cast("c"."tensor", 'int32', 'float64') AS "tensor"
  FROM "A" AS "c"
), "t1" AS (
  SELECT
    tensor_cast("c"."tensor", 'float32', 'float64') AS "tensor"
  FROM "s" AS "c"
), "t2" AS (
  SELECT
    "x"."k1" AS "k0",
    "x"."k0" AS "k1",
    tensor_einsum_cuda(
      0,
      'ab,->ba',
      'multiply',
      'sum',
      'float64',
      "x"."tensor",
      [3, 2],
      "y"."tensor",
      CAST([] AS BIGINT[])
    ) AS "tensor"
  FROM "t0" AS "x"
  CROSS JOIN "t1" AS "y"
)
SELECT
  *
FROM "t2"
WHERE
  NOT "tensor" IS NULL
