-- Per group: accuracy over all samples (unparsed = wrong) and, for the bootstrap, the distinct
-- item kinds: an item is one (run, item) with m samples of which c are correct; the lists hold each
-- distinct (m, c) pair and how many items have it, ordered by (m, c). Resampling items with
-- replacement only changes how many items of each kind are drawn (multinomial counts), so the
-- bootstrap needs these few kinds, never a list of every item. Self-evaluation runs are excluded.
-- {source} / {item_key}: `scored` and its item_id, or over the store's facts `scored_probs` and the
-- integer item_code that numbers the same items (robustness._item_key).
WITH i AS (
    SELECT {by} run_id AS _run, {item_key} AS _item, count(*) AS m, sum(correct::INT)::BIGINT AS c
    FROM {source}
    WHERE NOT starts_with(prompt_style, 'self_eval:')
    GROUP BY ALL
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
