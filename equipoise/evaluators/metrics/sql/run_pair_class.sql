-- pair_class: the runs numbered by the five settings that two runs must share for their items to
-- pair (dataset, model, backend, prompt style, decoding). NULL when one setting is NULL, which `=`
-- never matches either. Numbered once over the few runs, so that items and samples pair on one
-- integer instead of five strings. Included as {run_class} by clr_humility.sql, clr_idk_shift.sql
-- and rob_pairs.sql (registry.RUN_CLASS_SQL).
SELECT run_id,
       dense_rank() OVER (ORDER BY dataset_id, model, backend, prompt_style, decoding_json) AS pair_class
FROM runs
WHERE dataset_id IS NOT NULL AND model IS NOT NULL AND backend IS NOT NULL
  AND prompt_style IS NOT NULL AND decoding_json IS NOT NULL
