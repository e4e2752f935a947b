-- Multi-class Brier score of the softmax over the item's options (option_probs): per sample
-- sum_o (p_o - 1[o is the target])^2 (range [0, 2]), averaged over the samples whose option scores
-- cover every option of the item (covered = n_options). The forecast is the distribution, not the
-- parsed letter, so a fully scored sample counts whatever its parse (n_used_unparsed says how many
-- such samples were used). Samples with some but not all options scored (n_partial) or none
-- (n_unscored) are excluded and counted; coverage = n / n_total.
-- The per-sample count and Brier term are write-time facts (sample_probs.sql) that cal_samples
-- carries (n_scored, brier_mc); an unparsed sample is one with cal_status 'unparsed'
-- (the boolean `unparsed`).
WITH s AS (
    SELECT cs.*, brier_mc AS bs, coalesce(n_scored = n_options, false) AS full_cover
    FROM cal_samples cs
)
SELECT {by}
       count(*)                                                        AS n_total,
       count(*) FILTER (WHERE full_cover)                              AS n,
       count(*) FILTER (WHERE NOT full_cover)                          AS n_excluded,
       count(*) FILTER (WHERE NOT full_cover AND n_scored > 0)         AS n_partial,
       count(*) FILTER (WHERE n_scored IS NULL)                        AS n_unscored,
       count(*) FILTER (WHERE full_cover AND unparsed)                AS n_used_unparsed,
       count(*) FILTER (WHERE full_cover) / count(*)                   AS coverage,
       -- terms in [0, 2] summed exactly in fixed point (units of 2^-90, see cal_bins.sql): a parallel
       -- avg() of doubles adds in thread order, so its last bits varied
       sum((bs * (2::DOUBLE ^ 90))::HUGEINT) FILTER (WHERE full_cover)::DOUBLE / (2::DOUBLE ^ 90)
         / count(bs) FILTER (WHERE full_cover)                         AS brier_multiclass
FROM s
{group_by}
ORDER BY ALL
