-- Determinability (seed 003 3.4.2, Table 3): per group and information condition, the share of
-- correct decisions and how the wrong ones split. Rows: every decision sample of a determinability
-- item, self-evaluation runs (prompt_style 'self_eval:...') excluded. A sample that chose no
-- option (unparsed, error, or a label that is not one of the three) counts in n, is never correct,
-- and is reported in unparsed_rate, so for every condition the reported shares add up to 1:
--   complete / incomplete_determinable:  accuracy + wrong_decision + excessive_abstention + unparsed
--   incomplete_undeterminable:           accuracy + premature_judgment + unparsed
WITH d AS (
    SELECT *
    FROM scored
    WHERE task = 'determinability' AND NOT starts_with(prompt_style, 'self_eval:')
)
SELECT {by}
       condition,
       count(*)                                                                      AS n,
       sum(correct::INT)::BIGINT                                                     AS n_correct,
       avg(correct::INT)                                                             AS accuracy,
       -- undeterminable cases answered 'Met' / 'Not met'
       avg(CASE WHEN condition = 'incomplete_undeterminable'
                THEN coalesce(parsed_role IN ('gold', 'distractor'), false)::INT END) AS premature_judgment_rate,
       -- determinable (complete or incomplete) cases answered 'Unable to determine'
       avg(CASE WHEN condition IN ('complete', 'incomplete_determinable')
                THEN coalesce(parsed_role = 'abstain', false)::INT END)              AS excessive_abstention_rate,
       -- determinable cases answered with the opposite decision
       avg(CASE WHEN condition IN ('complete', 'incomplete_determinable')
                THEN coalesce(parsed_role = 'distractor', false)::INT END)           AS wrong_decision_rate,
       avg((parsed_role IS NULL)::INT)                                               AS unparsed_rate
FROM d
GROUP BY ALL
ORDER BY ALL
