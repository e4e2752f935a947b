-- Reliability diagram rows: one row per group and bin, all {n_bins} bins (an empty bin has n = 0
-- and NULL mean_confidence / accuracy / gap). Bins as in cal_ece.sql (last bin closed at 1.0).
-- n_group = used rows of the group, n_excluded = its excluded rows (repeated on every bin row).
WITH b AS (
    SELECT *, CASE WHEN used THEN {bin_expr} END AS bin
    FROM cal_samples
),
g AS (
    SELECT {by} count(*) FILTER (WHERE used) AS n_group, count(*) FILTER (WHERE NOT used) AS n_excl
    FROM b
    {group_by}
),
x AS (
    SELECT {by} bin, 1 AS w, confidence, correct::DOUBLE AS hit, NULL::BIGINT AS n_group,
           NULL::BIGINT AS n_excl
    FROM b
    WHERE used
    UNION ALL BY NAME
    SELECT {by} range AS bin, 0 AS w, NULL AS confidence, NULL AS hit, n_group, n_excl
    FROM g CROSS JOIN range({n_bins})
)
SELECT {by}
       bin,
       bin / {n_bins}                               AS lower,
       (bin + 1) / {n_bins}                         AS upper,
       sum(w)::BIGINT                               AS n,
       avg(confidence)                              AS mean_confidence,
       avg(hit)                                     AS accuracy,
       avg(hit) - avg(confidence)                   AS gap,
       max(n_group)                                 AS n_group,
       max(n_excl)                                  AS n_excluded
FROM x
GROUP BY {by} bin
ORDER BY ALL
