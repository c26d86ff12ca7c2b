WITH "t0" AS (
  SELECT
    CAST(0 AS INT) AS "k0",
    CAST(0 AS INT) AS "k1",
    tensor_einsum_path(
      '1,2:ab,bc->ac;0,3:ab,ca->cb',
      'float64',
      [3, 50, 4, 40, 40, 3],
      "x0"."tensor",
      "x1"."tensor",
      "x2"."tensor"
    ) AS "tensor"
  FROM "C" AS "x0"
  POSITIONAL JOIN "A" AS "x1"
  POSITIONAL JOIN "B" AS "x2"
)
SELECT
  *
FROM "t0"
WHERE
  NOT "tensor" IS NULL
