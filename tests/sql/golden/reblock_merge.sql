WITH "t0" AS (
  SELECT
    CAST("c"."k0" // 2 AS INT) AS "k0",
    CAST("c"."k1" // 2 AS INT) AS "k1",
    tensor_assemble(
      'float64',
      "c"."tensor",
      [least(2, 9 - 2 * "c"."k0"), 5],
      [(
          "c"."k0" % 2
        ) * 2, (
          "c"."k1" % 2
      ) * 5],
      [least(4, 9 - 4 * CAST("c"."k0" // 2 AS INT)), 10]
    ) AS "tensor"
  FROM "A" AS "c"
  GROUP BY
    CAST("c"."k0" // 2 AS INT),
    CAST("c"."k1" // 2 AS INT)
)
SELECT
  *
FROM "t0"
