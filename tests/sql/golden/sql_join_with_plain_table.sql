SELECT
  c.i0,
  c.value * w.w
FROM (
  SELECT
    CAST("o0" + (
      "f" // "s0"
    ) AS BIGINT) AS i0,
    CAST("o1" + (
      "f" // "s1"
    ) % "e1" AS BIGINT) AS i1,
    "value"
  FROM (
    SELECT
      "o0",
      "e0",
      "s0",
      "o1",
      "e1",
      "s1",
      UNNEST("l") AS value,
      generate_subscripts("l", 1) - 1 AS f
    FROM (
      SELECT
        "k0" * 4 AS o0,
        least(4, 4 - "k0" * 4) AS e0,
        1 * least(4, 4 - "k1" * 4) AS s0,
        "k1" * 4 AS o1,
        least(4, 4 - "k1" * 4) AS e1,
        1 AS s1,
        tensor_to_list("tensor", 'float64') AS l
      FROM (
        WITH "t0" AS (
          SELECT
            CAST("c"."k0" // 2 AS INT) AS "k0",
            CAST("c"."k1" // 2 AS INT) AS "k1",
            tensor_assemble(
              'float64',
              "c"."tensor",
              [2, 2],
              [(
                  "c"."k0" % 2
                ) * 2, (
                  "c"."k1" % 2
              ) * 2],
              [4, 4]
            ) AS "tensor"
          FROM "G" AS "c"
          GROUP BY
            CAST("c"."k0" // 2 AS INT),
            CAST("c"."k1" // 2 AS INT)
        ), "t1" AS (
          SELECT
            "x"."k0" AS "k0",
            "y"."k1" AS "k1",
            tensor_einsum('ab,bc->ac', 'multiply', 'sum', 'float64', "x"."tensor", [4, 4], "y"."tensor", [4, 4]) AS "tensor"
          FROM "t0" AS "x"
          CROSS JOIN "t0" AS "y"
        ), "t2" AS (
          SELECT
            CAST("g0"."k" AS INT) AS "k0",
            CAST("g1"."k" AS INT) AS "k1",
            coalesce("b"."tensor", tensor_zeros('float64', [4, 4])) AS "tensor"
          FROM range(0, 1) AS "g0"("k")
          CROSS JOIN range(0, 1) AS "g1"("k")
          LEFT JOIN "t1" AS "b"
            ON "b"."k0" = "g0"."k" AND "b"."k1" = "g1"."k"
        )
        SELECT
          *
        FROM "t2"
        WHERE
          NOT "tensor" IS NULL
        UNION ALL
        SELECT
          CAST(NULL AS INT) AS "k0",
          CAST(NULL AS INT) AS "k1",
          CAST(error(
            concat(
              'tensorsql: corrupted stored table {"table": "G", "shape": [4, 4], "blocks": [2, 2], "dtype": "float64", "check": "keys"} ',
              CAST(["g"."k0", "g"."k1"] AS TEXT),
              ' ',
              CAST("g"."n" AS TEXT)
            )
          ) AS BLOB) AS "tensor"
        FROM (
          SELECT
            "t",
            "k0",
            "k1",
            "ok",
            COUNT(*) AS "n"
          FROM (
            SELECT
              0 AS "t",
              "k0" AS "k0",
              "k1" AS "k1",
              "k0" BETWEEN 0 AND 1 AND "k1" BETWEEN 0 AND 1 AS "ok"
            FROM "G"
          ) AS "u"
          GROUP BY
            "t",
            "k0",
            "k1",
            "ok"
        ) AS g
        WHERE
          "g"."n" > 1 OR NOT coalesce("g"."ok", FALSE)
      ) AS _ts_blocks
    ) AS _ts_lists
  ) AS _ts_cells
) AS c
JOIN w
  ON w.id = c.i0
