-- Per-pair uncertainty differences (perturbed - base) per group, as one list per group in a fixed
-- order (base run, base item, perturbed item) so a seeded bootstrap is reproducible. Pairs where
-- either side has no uncertainty are counted in n_missing and left out of the list.
SELECT {by}
       count(*)                                                                     AS n_pairs,
       count(*) FILTER (WHERE base_uncertainty IS NULL OR perturbed_uncertainty IS NULL) AS n_missing,
       coalesce(list(perturbed_uncertainty - base_uncertainty
                     ORDER BY run_id, base_item_id, perturbed_run_id, perturbed_item_id)
                FILTER (WHERE base_uncertainty IS NOT NULL AND perturbed_uncertainty IS NOT NULL),
                [])                                                                 AS diffs
FROM rob_pairs
{group_by}
ORDER BY ALL
