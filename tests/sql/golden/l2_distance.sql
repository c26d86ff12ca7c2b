WITH "t0" AS (
  SELECT
    CAST("g0"."k" AS INT) AS "k0",
    CAST("g1"."k" AS INT) AS "k1",
    coalesce("b"."tensor", tensor_zeros('float64', [2, 3])) AS "tensor"
  FROM range(0, 2) AS "g0"("k")
  CROSS JOIN range(0, 2) AS "g1"("k")
  LEFT JOIN "X" AS "b"
    ON "b"."k0" = "g0"."k" AND "b"."k1" = "g1"."k"
), "t1" AS (
  SELECT
    CAST("g0"."k" AS INT) AS "k0",
    CAST("g1"."k" AS INT) AS "k1",
    coalesce("b"."tensor", tensor_zeros('float64', [3, 2])) AS "tensor"
  FROM range(0, 2) AS "g0"("k")
  CROSS JOIN range(0, 2) AS "g1"("k")
  LEFT JOIN "Y" AS "b"
    ON "b"."k0" = "g0"."k" AND "b"."k1" = "g1"."k"
), "t2" AS (
  SELECT
    "x"."k0" AS "k0",
    "y"."k1" AS "k1",
    tensor_einsum_agg('ab,bc->ac', 'sqdiff', 'sum', 'float64', "x"."tensor", "x"."__ts_shape", "y"."tensor", [3, 2]) AS "tensor"
  FROM (
    SELECT
      *,
      tensor_pin([2, 3]) AS "__ts_shape"
    FROM "t0" AS "x"
  ) AS "x"
  JOIN "t1" AS "y"
    ON "x"."k1" = "y"."k0"
  GROUP BY
    "x"."k0",
    "y"."k1"
)
SELECT
  *
FROM "t2"
