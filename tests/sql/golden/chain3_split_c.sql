WITH "t0" AS (
  SELECT
    "x"."k0" AS "k0",
    "y"."k1" AS "k1",
    tensor_einsum('ab,bc->ac', 'multiply', 'sum', 'float64', "x"."tensor", [4, 40], "y"."tensor", [40, 3]) AS "tensor"
  FROM "A" AS "x"
  POSITIONAL JOIN "B" AS "y"
), "t1" AS (
  SELECT
    "y"."k0" AS "k0",
    "x"."k1" AS "k1",
    tensor_einsum('ab,ca->cb', 'multiply', 'sum', 'float64', "x"."tensor", [3, 10], "y"."tensor", [4, 3]) AS "tensor"
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
)
SELECT
  *
FROM "t1"
WHERE
  NOT "tensor" IS NULL
