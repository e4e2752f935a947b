-- Reliability diagram rows: one row per group and bin, all {n_bins} bins (an empty bin has n = 0
-- and NULL mean_confidence / accuracy / gap). Bins as in cal_ece.sql (last bin closed at 1.0).
-- n_group = used rows of the group, n_excluded = its excluded rows (repeated on every bin row).
-- The per-bin counts and means come from cal_bins (cal_bins.sql, shared with ece and brier: at most
-- one row per group and bin, so max() below reads that row's value); every bin of every group gets
-- a row with n = 0 from the group's totals, which the bin's own row (if any) adds to.
WITH g AS (
    SELECT {by}
           coalesce(sum(n_b) FILTER (WHERE bin IS NOT NULL), 0)::BIGINT AS n_group,
           coalesce(sum(n_b) FILTER (WHERE bin IS NULL), 0)::BIGINT     AS n_excl
    FROM cal_bins
    {group_by}
),
x AS (
    SELECT {by} bin, n_b AS w, conf_b, acc_b, NULL::BIGINT AS n_group, NULL::BIGINT AS n_excl
    FROM cal_bins
    WHERE bin IS NOT NULL
    UNION ALL BY NAME
    SELECT {by} range AS bin, 0 AS w, NULL AS conf_b, NULL AS acc_b, n_group, n_excl
    FROM g CROSS JOIN range({n_bins})
)
SELECT {by}
       bin,
       bin / {n_bins}                               AS lower,
       (bin + 1) / {n_bins}                         AS upper,
       sum(w)::BIGINT                               AS n,
       max(conf_b)                                  AS mean_confidence,
       max(acc_b)                                   AS accuracy,
       max(acc_b) - max(conf_b)                     AS gap,
       max(n_group)                                 AS n_group,
       max(n_excl)                                  AS n_excluded
FROM x
GROUP BY {by} bin
ORDER BY ALL
