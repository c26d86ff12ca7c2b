WITH "t0" AS (
  SELECT
    CAST("c"."__ts_r0" AS INT) AS "k0",
    CAST("c"."__ts_r1" AS INT) AS "k1",
    tensor_slice(
      'float64',
      "c"."tensor",
      [least(4, 9 - 4 * "c"."k0"), 10],
      [
        greatest("c"."k0" * 4, "c"."__ts_r0" * 2) - "c"."k0" * 4,
        greatest("c"."k1" * 10, "c"."__ts_r1" * 5) - "c"."k1" * 10
      ],
      [
        least(least((
          "c"."k0" + 1
        ) * 4, 9), (
          "c"."__ts_r0" + 1
        ) * 2) - "c"."k0" * 4,
        least(least((
          "c"."k1" + 1
        ) * 10, 10), (
          "c"."__ts_r1" + 1
        ) * 5) - "c"."k1" * 10
      ]
    ) AS "tensor"
  FROM (
    SELECT
      *,
      UNNEST(
        range("c"."k1" * 10 // 5, (
          least((
            "c"."k1" + 1
          ) * 10, 10) - 1
        ) // 5 + 1)
      ) AS "__ts_r1"
    FROM (
      SELECT
        *,
        UNNEST(
          range("c"."k0" * 4 // 2, (
            least((
              "c"."k0" + 1
            ) * 4, 9) - 1
          ) // 2 + 1)
        ) AS "__ts_r0"
      FROM "A" AS "c"
    ) AS "c"
  ) AS "c"
)
SELECT
  *
FROM "t0"
