-- Accuracy among decisions the model itself judged 'Correct' (seed 003 3.3.2, Tables A.6 / A.7).
-- A self-evaluation run is a run whose prompt_style is 'self_eval:<decision prompt_style>' with the
-- decision run's model, backend, dataset_id and config; its prediction for (item_id, sample_index)
-- is the verdict on the decision sample with the same item_id and sample_index. Verdict labels are
-- 'Correct' / 'Incorrect'; anything else (NULL, other text) is an unparsed verdict: counted, never
-- 'judged correct'. Every decision sample stays in n; one without a verdict adds nothing to the
-- verdict counts, so with no self-evaluation runs the verdict columns are 0 and the rates NULL.
-- Several verdicts on one decision sample (several linked self-evaluation runs) each count.
WITH d AS (
    SELECT *
    FROM scored
    WHERE task = 'determinability' AND NOT starts_with(prompt_style, 'self_eval:')
),
v AS (
    SELECT r.model, r.backend, r.dataset_id, r.config,
           substr(r.prompt_style, length('self_eval:') + 1)                AS judged_style,
           p.item_id, p.sample_index,
           count(*)                                                        AS n_verdicts,
           count(*) FILTER (WHERE p.parsed_label = 'Correct')              AS n_judged_correct,
           count(*) FILTER (WHERE p.parsed_label = 'Incorrect')            AS n_judged_incorrect
    FROM predictions p
    JOIN runs r USING (run_id)
    WHERE starts_with(r.prompt_style, 'self_eval:')
    GROUP BY ALL
),
j AS (
    SELECT d.*,
           coalesce(v.n_verdicts, 0)         AS n_verdicts,
           coalesce(v.n_judged_correct, 0)   AS n_judged_correct,
           coalesce(v.n_judged_incorrect, 0) AS n_judged_incorrect
    FROM d
    LEFT JOIN v ON v.model = d.model AND v.backend = d.backend AND v.dataset_id = d.dataset_id
               AND v.config = d.config AND v.judged_style = d.prompt_style
               AND v.item_id = d.item_id AND v.sample_index = d.sample_index
)
SELECT {by}
       condition,
       count(*)                                                                     AS n,
       avg(correct::INT)                                                            AS accuracy,
       sum(n_verdicts)::BIGINT                                                      AS n_self_evaluated,
       sum(n_judged_correct)::BIGINT                                                AS n_judged_correct,
       sum(n_verdicts - n_judged_correct - n_judged_incorrect)::BIGINT              AS n_verdict_unparsed,
       sum(n_judged_correct) / nullif(sum(n_verdicts), 0)                           AS judged_correct_rate,
       sum(n_verdicts * correct::INT) / nullif(sum(n_verdicts), 0)                  AS accuracy_self_evaluated,
       sum(n_judged_correct * correct::INT) / nullif(sum(n_judged_correct), 0)      AS filtered_accuracy
FROM j
GROUP BY ALL
ORDER BY ALL
