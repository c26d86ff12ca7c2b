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
      [40, 3]
    ) AS "tensor"
  FROM (
    SELECT
      *,
      tensor_pin([4, 40]) AS "__ts_shape"
    FROM "A" AS "x"
  ) AS "x"
  JOIN "B" AS "y"
    ON "x"."k1" = "y"."k0"
  GROUP BY
    "x"."k0",
    "y"."k1"
), "t1" AS (
  SELECT
    "y"."k0" AS "k0",
    "x"."k1" AS "k1",
    tensor_einsum_agg('ab,ca->cb', 'multiply', 'sum', 'float64', "x"."tensor", [3, 10], "y"."tensor", [4, 3]) AS "tensor"
  FROM "C" AS "x"
  POSITIONAL JOIN (
    SELECT
      *,
      UNNEST(range((
        SELECT
          COUNT(*)
        FROM "C"
      ))) AS "__ts_rep"
    FROM "t0" AS "y"
  ) AS "y"
  GROUP BY
    "y"."k0",
    "x"."k1"
)
SELECT
  *
FROM "t1"
