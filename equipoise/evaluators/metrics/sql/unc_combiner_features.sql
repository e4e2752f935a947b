-- Feature matrix for the reasoning-trace combiners (seed 002, appendix D): one row per
-- (run_id, item_id) from sample 0, the label (incorrect = not correct; unparsed counts as
-- incorrect, as in accuracy), the md5 train/test split, and every feature min-max scaled with the
-- bounds of the group's training rows (a constant feature scales to 0). Rows with a NULL feature
-- stay, flagged by complete = false, and are left out of fitting and scoring.
WITH sc AS (
{scores_sql}
),
base AS (
    SELECT {strata} run_id, item_id, NOT correct AS incorrect,
           ('0x' || substr(md5({split_key}), 1, 8))::UBIGINT / 4294967296.0 < {train_fraction} AS is_train,
           {feature_casts},
           {complete} AS complete
    FROM sc
)
SELECT *, {scaled}
FROM base
WINDOW w AS (PARTITION BY {part} complete)
ORDER BY ALL
