-- `scored` with the per-sample facts of its option distribution that the calibration metrics read
-- (sample_probs.sql: n_scored, brier_mc, chosen_prob, target_prob; all NULL when no option of the
-- sample was scored): one row per row of `scored`, nothing dropped (LEFT JOIN on the sample's key,
-- which is unique in sample_probs).
-- It also carries the conformal LAC / APS scores of the sample (lac_scores, lac_target, aps_scores,
-- aps_target), so that with facts the conformal option metrics read a unit's scores from the row
-- they already point at (conformal.py, `_cached_option_units`) instead of joining sample_probs on
-- the key.
-- Why a relation of its own: with the store's facts current it is the fact table facts_scored
-- itself, which holds these eight columns and the integer item_code (written once per store,
-- facts.py), so cal_samples reads
-- them without joining every prediction to sample_probs on a key of two strings (at 1M
-- predictions that hash join was most of the time of filling the calibration caches). Without
-- facts it is this join, as a view.
SELECT sc.*, sp.n_scored, sp.brier_mc, sp.chosen_prob, sp.target_prob,
       sp.lac_scores, sp.lac_target, sp.aps_scores, sp.aps_target
FROM scored sc
LEFT JOIN sample_probs sp ON sp.run_id = sc.run_id AND sp.item_id = sc.item_id
                         AND sp.sample_index = sc.sample_index
