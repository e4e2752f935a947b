-- The 2x2 tables behind seed 003's comparison of each incomplete condition with Complete (3.4.2):
-- per group, correct / total decisions under Complete and under each incomplete condition. The
-- exact test itself runs on these counts (determinability.py). Unparsed samples count as wrong;
-- self-evaluation runs are excluded. A condition missing from a group gives a row with n = 0.
WITH d AS (
    SELECT *
    FROM scored
    WHERE task = 'determinability' AND NOT starts_with(prompt_style, 'self_eval:')
),
g AS (
    SELECT {by}
           count(*) FILTER (WHERE condition = 'complete')                                AS n_complete,
           count(*) FILTER (WHERE condition = 'complete' AND correct)                    AS n_correct_complete,
           count(*) FILTER (WHERE condition = 'incomplete_determinable')                 AS n_det,
           count(*) FILTER (WHERE condition = 'incomplete_determinable' AND correct)     AS n_correct_det,
           count(*) FILTER (WHERE condition = 'incomplete_undeterminable')               AS n_und,
           count(*) FILTER (WHERE condition = 'incomplete_undeterminable' AND correct)   AS n_correct_und
    FROM d
    {group_by}
)
SELECT * FROM (
    SELECT {by} 'incomplete_determinable' AS condition, n_det AS n, n_correct_det AS n_correct,
           n_complete, n_correct_complete
    FROM g
    UNION ALL
    SELECT {by} 'incomplete_undeterminable' AS condition, n_und AS n, n_correct_und AS n_correct,
           n_complete, n_correct_complete
    FROM g
)
ORDER BY ALL
