WITH "t0" AS (
  SELECT
    "c"."k0" AS "k0",
    CAST("c"."__ts_r1" AS INT) AS "k1",
    tensor_assemble(
      'float64',
      tensor_slice(
        'float64',
        "c"."tensor",
        [least(2, 5 - 2 * "c"."k0"), 4],
        [0, greatest("c"."k1" * 4, "c"."__ts_r1" * 3) - "c"."k1" * 4],
        [
          least(2, 5 - 2 * "c"."k0"),
          least(least((
            "c"."k1" + 1
          ) * 4, 4), (
            "c"."__ts_r1" + 1
          ) * 3) - "c"."k1" * 4
        ]
      ),
      [
        least(2, 5 - 2 * "c"."k0"),
        least(least((
          "c"."k1" + 1
        ) * 4, 4), (
          "c"."__ts_r1" + 1
        ) * 3) - greatest("c"."k1" * 4, "c"."__ts_r1" * 3)
      ],
      [0, greatest("c"."k1" * 4, "c"."__ts_r1" * 3) - "c"."__ts_r1" * 3],
      [least(2, 5 - 2 * "c"."k0"), least(3, 4 - 3 * "c"."__ts_r1")]
    ) AS "tensor"
  FROM (
    SELECT
      *,
      UNNEST(
        range("c"."k1" * 4 // 3, (
          least((
            "c"."k1" + 1
          ) * 4, 4) - 1
        ) // 3 + 1)
      ) AS "__ts_r1"
    FROM "A" AS "c"
  ) AS "c"
  GROUP BY
    "c"."k0",
    CAST("c"."__ts_r1" AS INT)
), "t1" AS (
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
      [least(3, 4 - 3 * "y"."k0"), 3]
    ) AS "tensor"
  FROM (
    SELECT
      *,
      tensor_pin([least(2, 5 - 2 * "x"."k0"), least(3, 4 - 3 * "x"."k1")]) AS "__ts_shape"
    FROM "t0" AS "x"
  ) AS "x"
  JOIN "B" AS "y"
    ON "x"."k1" = "y"."k0"
  GROUP BY
    "x"."k0",
    "y"."k1"
)
SELECT
  *
FROM "t1"
