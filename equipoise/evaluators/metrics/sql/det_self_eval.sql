-- Accuracy among decisions the model itself judged 'Correct' (seed 003 3.3.2, Tables A.6 / A.7).
-- A self-evaluation run is a run whose prompt_style is 'self_eval:<decision prompt_style>' with the
-- decision run's model, backend, dataset_id and config; its prediction for (item_id, sample_index)
-- is the verdict on the decision sample with the same item_id and sample_index. Verdict labels are
-- 'Correct' / 'Incorrect'; anything else (NULL, other text) is an unparsed verdict: counted, never
-- 'judged correct'. Every decision sample stays in n; one without a verdict adds nothing to the
-- verdict counts, so with no self-evaluation runs the verdict columns are 0 and the rates NULL.
-- Several verdicts on one decision sample (several linked self-evaluation runs) each count.
-- The five settings that link a verdict to a decision (model, backend, dataset_id, config and the
-- judged prompt_style) are all columns of `runs`, so the self-evaluation runs are numbered by them
-- once over the few runs (se_class) and each decision run looks its number up, also over `runs`:
-- the samples then join on (se_class, item_id, sample_index) instead of matching five strings per
-- sample (about a fifth of the metric's CPU at 1M predictions). A setting that is NULL on either
-- side never links (`=`), as when the samples matched them.
WITH d AS (
    SELECT *
    FROM scored
    WHERE task = 'determinability' AND NOT starts_with(prompt_style, 'self_eval:')
),
se_runs AS (
    SELECT *, dense_rank() OVER (ORDER BY model, backend, dataset_id, config, judged_style) AS se_class
    FROM (SELECT run_id, model, backend, dataset_id, config,
                 substr(prompt_style, length('self_eval:') + 1) AS judged_style
          FROM runs
          WHERE starts_with(prompt_style, 'self_eval:'))
),
decision_class AS (  -- each decision run's self-evaluation class (runs without one are absent)
    SELECT DISTINCT r.run_id, s.se_class
    FROM runs r
    JOIN se_runs s ON s.model = r.model AND s.backend = r.backend AND s.dataset_id = r.dataset_id
                  AND s.config = r.config AND s.judged_style = r.prompt_style
),
v AS (
    SELECT s.se_class, p.item_id, p.sample_index,
           count(*)                                                        AS n_verdicts,
           count(*) FILTER (WHERE p.parsed_label = 'Correct')              AS n_judged_correct,
           count(*) FILTER (WHERE p.parsed_label = 'Incorrect')            AS n_judged_incorrect
    FROM predictions p
    JOIN se_runs s USING (run_id)
    GROUP BY ALL
),
j AS (
    SELECT d.*,
           coalesce(v.n_verdicts, 0)         AS n_verdicts,
           coalesce(v.n_judged_correct, 0)   AS n_judged_correct,
           coalesce(v.n_judged_incorrect, 0) AS n_judged_incorrect
    FROM d
    LEFT JOIN decision_class dc USING (run_id)
    LEFT JOIN v ON v.se_class = dc.se_class AND v.item_id = d.item_id AND v.sample_index = d.sample_index
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
