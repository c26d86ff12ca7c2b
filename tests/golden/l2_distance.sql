WITH "t0" AS (
  SELECT
    "x"."k0" AS "k0",
    "y"."k1" AS "k1",
    tensor_einsum_agg('ab,bc->ac', 'sqdiff', 'sum', 'float64', "x"."tensor", [2, 3], "y"."tensor", [3, 2]) AS "tensor"
  FROM "X" AS "x"
  JOIN "Y" AS "y"
    ON "x"."k1" = "y"."k0"
  GROUP BY
    "x"."k0",
    "y"."k1"
)
SELECT
  *
FROM "t0"
