WITH "t0" AS (
  SELECT
    "m0"."t" AS "k0",
    "m1"."t" AS "k1",
    tensor_assemble(
      'float64',
      tensor_slice_strided('float64', "c"."tensor", [4, 4], ["m0"."a", "m1"."a"], ["m0"."n", "m1"."n"], [-1, 1]),
      ["m0"."n", "m1"."n"],
      ["m0"."o", "m1"."o"],
      [4, 4]
    ) AS "tensor"
  FROM "M" AS "c"
  JOIN (VALUES
    (0, 1, 3, 4, 0),
    (1, 0, 3, 4, 0)) AS m0(s, t, a, n, o)
    ON "m0"."s" = "c"."k0"
  JOIN (VALUES
    (0, 0, 2, 2, 0),
    (1, 0, 0, 2, 2)) AS m1(s, t, a, n, o)
    ON "m1"."s" = "c"."k1"
  GROUP BY
    "m0"."t",
    "m1"."t"
)
SELECT
  *
FROM "t0"
