WITH "t0" AS (
  SELECT
    "c"."k0" AS "k0",
    CAST("r1"."k1" AS INT) AS "k1",
    tensor_assemble(
      'float64',
      tensor_slice(
        'float64',
        "c"."tensor",
        [least(2, 5 - 2 * "c"."k0"), 4],
        [0, greatest("c"."k1" * 4, "r1"."k1" * 3) - "c"."k1" * 4],
        [
          least(2, 5 - 2 * "c"."k0"),
          least(least((
            "c"."k1" + 1
          ) * 4, 4), (
            "r1"."k1" + 1
          ) * 3) - "c"."k1" * 4
        ]
      ),
      [
        least(2, 5 - 2 * "c"."k0"),
        least(least((
          "c"."k1" + 1
        ) * 4, 4), (
          "r1"."k1" + 1
        ) * 3) - greatest("c"."k1" * 4, "r1"."k1" * 3)
      ],
      [0, greatest("c"."k1" * 4, "r1"."k1" * 3) - "r1"."k1" * 3],
      [least(2, 5 - 2 * "c"."k0"), least(3, 4 - 3 * "r1"."k1")]
    ) AS "tensor"
  FROM "A" AS "c"
  CROSS JOIN range("c"."k1" * 4 // 3, (
    least((
      "c"."k1" + 1
    ) * 4, 4) - 1
  ) // 3 + 1) AS "r1"("k1")
  GROUP BY
    "c"."k0",
    CAST("r1"."k1" AS INT)
), "t1" AS (
  SELECT
    "c"."k0" AS "i",
    "c"."k1" AS "j",
    "c"."tensor" AS "tensor"
  FROM "t0" AS "c"
), "t2" AS (
  SELECT
    "c"."k0" AS "j",
    "c"."k1" AS "k",
    "c"."tensor" AS "tensor"
  FROM "B" AS "c"
), "t3" AS (
  SELECT
    "x"."i" AS "i",
    "y"."k" AS "k",
    tensor_einsum_agg(
      'ab,bc->ac',
      'multiply',
      'sum',
      'float64',
      "x"."tensor",
      [least(2, 5 - 2 * "x"."i"), least(3, 4 - 3 * "x"."j")],
      "y"."tensor",
      [least(3, 4 - 3 * "y"."j"), 3]
    ) AS "tensor"
  FROM "t1" AS "x"
  JOIN "t2" AS "y"
    ON "x"."j" = "y"."j"
  GROUP BY
    "x"."i",
    "y"."k"
), "t4" AS (
  SELECT
    "c"."i" AS "k0",
    "c"."k" AS "k1",
    "c"."tensor" AS "tensor"
  FROM "t3" AS "c"
)
SELECT
  *
FROM "t4"
