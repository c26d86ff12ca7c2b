WITH "t0" AS (
  SELECT
    CAST(0 AS INT) AS "k0",
    CAST(0 AS INT) AS "k1",
    tensor_einsum_cuda(
      0,
      'ab,ca->cb',
      'multiply',
      'sum',
      'float64',
      "x0"."tensor",
      [3, 50],
      tensor_einsum_cuda(0, 'ab,bc->ac', 'multiply', 'sum', 'float64', "x1"."tensor", [4, 40], "x2"."tensor", [40, 3]),
      [4, 3]
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
