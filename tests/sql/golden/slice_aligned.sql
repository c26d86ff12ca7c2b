WITH "t0" AS (
  SELECT
    "m0"."t" AS "k0",
    "c"."k1" AS "k1",
    tensor_slice_strided('float64', "c"."tensor", [4, 4], ["m0"."a", 0], ["m0"."n", 4], [1, 1]) AS "tensor"
  FROM (
    SELECT
      *
    FROM "M" AS "c"
    WHERE
      "c"."k0" BETWEEN 1 AND 1
  ) AS "c"
  JOIN (VALUES
    (1, 0, 0, 4, 0)) AS m0(s, t, a, n, o)
    ON "m0"."s" = "c"."k0"
)
SELECT
  *
FROM "t0"
