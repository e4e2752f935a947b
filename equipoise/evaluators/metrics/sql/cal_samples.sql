-- The population every calibration / selective-prediction metric reads: one row per prediction
-- sample of `scored` (all samples, or sample 0 only), with its confidence and whether it is used.
-- Templated by equipoise.evaluators.metrics.calibration (samples_sql): the expression of the
-- confidence (chosen-option probability, target-option probability or exp(mean token
-- log-probability)) and the filter of the samples kept (all, or sample 0). Every row carries the
-- per-sample facts of its option distribution (scored_probs.sql: n_scored, brier_mc, chosen_prob,
-- target_prob; NULL when no option was scored), read from `scored_probs`, which is `scored` with
-- those columns (a column of the fact table facts_scored when the store's facts are current, so
-- no join here; brier_multiclass reads n_scored and brier_mc).
-- cal_status says what happens to a row, and nothing is dropped without being counted:
--   'unparsed'      no parsed option (unparseable output, error, or a label that is not an option of
--                   the item): there is no prediction whose confidence could be judged;
--   'no_confidence' a parsed option but no usable confidence (the chosen/target option was not
--                   scored, no token log-probabilities, or a value that is NULL, NaN or outside [0, 1]);
--   'used'          counted by the metrics.
-- The two booleans behind it are columns too, `unparsed` and `used` (cal_status = 'unparsed' /
-- 'used'), and the metrics test those: comparing the per-row string cost more CPU than the
-- aggregate that read it (brier at 1M predictions). The string stays in this view for whoever
-- reports it; the TEMP copy a pass keeps (calibration.py, _CACHED_COLUMNS) holds only the booleans.
CREATE OR REPLACE TEMP VIEW cal_samples AS
WITH c AS (
    SELECT sc.*, CAST({conf_expr} AS DOUBLE) AS conf_raw
    FROM scored_probs sc
    WHERE {sample_filter}
),
s AS (
    SELECT c.* EXCLUDE (conf_raw), conf_raw,
           c.parsed_option_id IS NULL                                        AS unparsed,
           c.parsed_option_id IS NOT NULL
             AND coalesce(NOT isnan(conf_raw) AND conf_raw >= 0 AND conf_raw <= 1, false) AS used
    FROM c
)
SELECT s.* EXCLUDE (conf_raw),
       CASE WHEN unparsed THEN 'unparsed' WHEN used THEN 'used' ELSE 'no_confidence' END AS cal_status,
       CASE WHEN used THEN conf_raw END                      AS confidence
FROM s;
