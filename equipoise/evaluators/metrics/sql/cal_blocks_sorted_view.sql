-- The cal_blocks view over the TEMP tables of cal_blocks_sorted.sql: the rows and columns of
-- cal_blocks.sql, the strata and counts of {groups} joined back on by _gid, and used, unparsed and
-- confidence read from _key (the confidence of a used row, -1 no_confidence, -2 unparsed).
CREATE OR REPLACE TEMP VIEW {view} AS
SELECT {by}
       _gid,
       _key >= 0 AS used,
       _key = -2 AS unparsed,
       CASE WHEN _key >= 0 THEN _key END AS confidence,
       n_b, e_b, k_before, e_before, n_used, n_group
FROM {blocks} JOIN {groups} USING (_gid)
