-- The 2x2 table of base vs perturbed correctness per group (seed 004 3.4: McNemar test for
-- accuracy changes); the test runs on the discordant counts in robustness.py. Unparsed samples are
-- wrong and counted per side. Base samples without a perturbed partner cannot enter a paired test;
-- they are counted in n_base_unpaired (a group may consist of them alone, with n_pairs = 0).
WITH x AS (
    SELECT *, true AS paired FROM rob_pairs
    UNION ALL BY NAME
    SELECT *, false AS paired FROM rob_base_unpaired
)
SELECT {by}
       count(*) FILTER (WHERE paired)                                                   AS n_pairs,
       count(*) FILTER (WHERE paired AND base_correct AND perturbed_correct)            AS n_stable_correct,
       count(*) FILTER (WHERE paired AND base_correct AND NOT perturbed_correct)        AS n_correct_to_wrong,
       count(*) FILTER (WHERE paired AND NOT base_correct AND perturbed_correct)        AS n_wrong_to_correct,
       count(*) FILTER (WHERE paired AND NOT base_correct AND NOT perturbed_correct)    AS n_stable_wrong,
       avg(base_correct::INT) FILTER (WHERE paired)                                     AS accuracy_base,
       avg(perturbed_correct::INT) FILTER (WHERE paired)                                AS accuracy_perturbed,
       avg(perturbed_correct::INT) FILTER (WHERE paired)
           - avg(base_correct::INT) FILTER (WHERE paired)                               AS accuracy_change,
       count(*) FILTER (WHERE paired AND base_unparsed)                                 AS n_unparsed_base,
       count(*) FILTER (WHERE paired AND perturbed_unparsed)                            AS n_unparsed_perturbed,
       count(*) FILTER (WHERE NOT paired)                                               AS n_base_unpaired
FROM x
{group_by}
ORDER BY ALL
