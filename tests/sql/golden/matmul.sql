WITH "t0" AS (
  SELECT
    "x"."k0" AS "k0",
    "y"."k1" AS "k1",
    tensor_einsum_agg(
      'ab,bc->ac',
      'multiply',
      'sum',
      'float64',
      "x"."tensor",
      "x"."__ts_shape",
      "y"."tensor",
      [3, 5]
    ) AS "tensor"
  FROM (
    SELECT
      *,
      tensor_pin([4, 3]) AS "__ts_shape"
    FROM "A" AS "x"
  ) AS "x"
  JOIN "B" AS "y"
    ON "x"."k1" = "y"."k0"
  GROUP BY
    "x"."k0",
    "y"."k1"
)
SELECT
  *
FROM "t0"
