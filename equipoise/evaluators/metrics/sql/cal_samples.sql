-- The population every calibration / selective-prediction metric reads: one row per prediction
-- sample of `scored` (all samples, or sample 0 only), with its confidence and whether it is used.
-- Templated by equipoise.evaluators.metrics.calibration (samples_sql): the expression of the
-- confidence (chosen-option probability, target-option probability or exp(mean token
-- log-probability)) and the filter of the samples kept (all, or sample 0). Every row carries the
-- per-sample facts of its option distribution (sample_probs: n_scored, brier_mc; NULL when no option
-- was scored), joined here once for every metric (brier_multiclass reads them).
-- cal_status says what happens to a row, and nothing is dropped without being counted:
--   'unparsed'      no parsed option (unparseable output, error, or a label that is not an option of
--                   the item): there is no prediction whose confidence could be judged;
--   'no_confidence' a parsed option but no usable confidence (the chosen/target option was not
--                   scored, no token log-probabilities, or a value that is NULL, NaN or outside [0, 1]);
--   'used'          counted by the metrics.
CREATE OR REPLACE TEMP VIEW cal_samples AS
WITH c AS (
    SELECT sc.*, sp.n_scored, sp.brier_mc, CAST({conf_expr} AS DOUBLE) AS conf_raw
    FROM scored sc
    LEFT JOIN sample_probs sp ON sp.run_id = sc.run_id AND sp.item_id = sc.item_id
                             AND sp.sample_index = sc.sample_index
    WHERE {sample_filter}
),
s AS (
    SELECT c.* EXCLUDE (conf_raw), conf_raw,
           CASE WHEN c.parsed_option_id IS NULL THEN 'unparsed'
                WHEN conf_raw IS NULL OR isnan(conf_raw) OR conf_raw < 0 OR conf_raw > 1 THEN 'no_confidence'
                ELSE 'used' END AS cal_status
    FROM c
)
SELECT s.* EXCLUDE (conf_raw),
       cal_status = 'used'                                   AS used,
       CASE WHEN cal_status = 'used' THEN conf_raw END       AS confidence
FROM s;
