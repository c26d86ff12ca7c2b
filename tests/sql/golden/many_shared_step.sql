WITH "t0" AS (
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
      [3, 5]
    ) AS "tensor"
  FROM (
    SELECT
      *,
      tensor_pin([4, 3]) AS "__ts_shape"
    FROM "A" AS "x"
  ) AS "x"
  JOIN "B" AS "y"
    ON "x"."k1" = "y"."k0"
  GROUP BY
    "x"."k0",
    "y"."k1"
), "_ts_shared_0_0" AS MATERIALIZED (
  SELECT
    *
  FROM "t0"
), "t1" AS (
  SELECT
    tensor_sum(tensor_einsum1('ab->', 'sum', 'float64', "c"."tensor", [4, 5]), 'float64') AS "tensor"
  FROM "_ts_shared_0_0" AS "c"
), "t2" AS (
  SELECT
    CAST("c"."__ts_r0" AS INT) AS "k0",
    "c"."k1" AS "k1",
    tensor_slice(
      'float64',
      "c"."tensor",
      [10, 2],
      [greatest("c"."k0" * 10, "c"."__ts_r0" * 5) - "c"."k0" * 10, 0],
      [
        least(least((
          "c"."k0" + 1
        ) * 10, 10), (
          "c"."__ts_r0" + 1
        ) * 5) - "c"."k0" * 10,
        2
      ]
    ) AS "tensor"
  FROM (
    SELECT
      *,
      UNNEST(
        range("c"."k0" * 10 // 5, (
          least((
            "c"."k0" + 1
          ) * 10, 10) - 1
        ) // 5 + 1)
      ) AS "__ts_r0"
    FROM "C" AS "c"
  ) AS "c"
)
SELECT
  0 AS "o",
  "w"."written"
FROM (
  SELECT
    tensor_sink_write(CAST(11 AS BIGINT), CAST([] AS BIGINT[]), 'float64', "c"."tensor", CAST([] AS BIGINT[])) AS "written"
  FROM "t1" AS "c"
) AS "w"
UNION ALL
SELECT
  1 AS "o",
  "w"."written"
FROM (
  SELECT
    tensor_einsum_agg_into(
      CAST(12 AS BIGINT),
      ["x"."k0" * 4, "y"."k1" * 2],
      'ab,bc->ac',
      'multiply',
      'sum',
      'float64',
      "x"."tensor",
      "x"."__ts_shape",
      "y"."tensor",
      [5, 2]
    ) AS "written"
  FROM (
    SELECT
      *,
      tensor_pin([4, 5]) AS "__ts_shape"
    FROM "_ts_shared_0_0" AS "x"
  ) AS "x"
  JOIN "t2" AS "y"
    ON "x"."k1" = "y"."k0"
  GROUP BY
    "x"."k0",
    "y"."k1"
) AS "w"
