-- Per group: accuracy over all samples (unparsed = wrong) and, for the bootstrap, each item's number
-- of samples m and of correct samples c as two lists in a fixed (run_id, item_id) order. An item is
-- one (run, item); the bootstrap resamples items, keeping an item's samples together.
-- Self-evaluation runs are excluded.
WITH i AS (
    SELECT {by} run_id AS _run, item_id AS _item, count(*) AS m, sum(correct::INT)::BIGINT AS c
    FROM scored
    WHERE NOT starts_with(prompt_style, 'self_eval:')
    GROUP BY ALL
)
SELECT {by}
       coalesce(sum(m), 0)::BIGINT          AS n,
       count(*)                             AS n_items,
       sum(c) / sum(m)                      AS accuracy,
       list(c ORDER BY _run, _item)         AS c,
       list(m ORDER BY _run, _item)         AS m
FROM i
{group_by}
ORDER BY ALL
