-- Per group: accuracy over all samples (unparsed = wrong) and, for the bootstrap, the distinct
-- item kinds: an item is one (run, item) with m samples of which c are correct; the lists hold each
-- distinct (m, c) pair and how many items have it, ordered by (m, c). Resampling items with
-- replacement only changes how many items of each kind are drawn (multinomial counts), so the
-- bootstrap needs these few kinds, never a list of every item. Self-evaluation runs are excluded.
-- {{item_counts}}: one row per item, the grouping's strata then m and c (robustness.py: grouped from
-- `scored`, or read from the per-item fact that a metrics pass over current facts has).
WITH i AS (
{item_counts}
),
kinds AS (
    SELECT {by} m, c, count(*) AS n_kind
    FROM i
    GROUP BY ALL
)
SELECT {by}
       coalesce(sum(m * n_kind), 0)::BIGINT          AS n,
       coalesce(sum(n_kind), 0)::BIGINT              AS n_items,
       sum(c * n_kind) / sum(m * n_kind)             AS accuracy,
       list(c ORDER BY m, c)                         AS c,
       list(m ORDER BY m, c)                         AS m,
       list(n_kind ORDER BY m, c)                    AS n_kind
FROM kinds
{group_by}
ORDER BY ALL
