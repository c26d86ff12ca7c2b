WITH "t0" AS (
  SELECT
    "m0"."t" AS "k0",
    "c"."k2" AS "k1",
    tensor_assemble(
      'float64',
      tensor_slice_strided(
        'float64',
        "c"."tensor",
        [
          least(3, 10 - 3 * "c"."k0"),
          least(4, 7 - 4 * "c"."k1"),
          least(2, 5 - 2 * "c"."k2")
        ],
        ["m0"."a", "m1"."a", 0],
        ["m0"."n", "m1"."n", least(2, 5 - 2 * "c"."k2")],
        [2, 1, 1]
      ),
      ["m0"."n", least(2, 5 - 2 * "c"."k2")],
      ["m0"."o", 0],
      [least(3, 4 - 3 * "m0"."t"), least(2, 5 - 2 * "c"."k2")]
    ) AS "tensor"
  FROM (
    SELECT
      *
    FROM "A" AS "c"
    WHERE
      "c"."k0" BETWEEN 0 AND 2 AND "c"."k1" BETWEEN 0 AND 0
  ) AS "c"
  JOIN (VALUES
    (0, 0, 1, 1, 0),
    (1, 0, 0, 2, 1),
    (2, 1, 1, 1, 0)) AS m0(s, t, a, n, o)
    ON "m0"."s" = "c"."k0"
  JOIN (VALUES
    (0, 0, 3, 1, 0)) AS m1(s, t, a, n, o)
    ON "m1"."s" = "c"."k1"
  GROUP BY
    "m0"."t",
    "c"."k2"
)
SELECT
  *
FROM "t0"
