-- One point per group (default: per model x prompting setting) for seed 003's trade-off analysis
-- (3.4.2, Figure 2): accuracy under Incomplete-Determinable and under Incomplete-Undeterminable.
-- Unparsed samples count as wrong; self-evaluation runs are excluded. A group lacking one of the two
-- conditions has a NULL coordinate and is left out of the correlation (and counted as such).
WITH d AS (
    SELECT *
    FROM scored
    WHERE task = 'determinability' AND NOT starts_with(prompt_style, 'self_eval:')
)
SELECT {by}
       count(*) FILTER (WHERE condition = 'incomplete_determinable')                    AS n_determinable,
       avg(correct::INT) FILTER (WHERE condition = 'incomplete_determinable')           AS acc_determinable,
       count(*) FILTER (WHERE condition = 'incomplete_undeterminable')                  AS n_undeterminable,
       avg(correct::INT) FILTER (WHERE condition = 'incomplete_undeterminable')         AS acc_undeterminable
FROM d
{group_by}
ORDER BY ALL
