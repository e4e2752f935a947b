-- The rows of cal_blocks from a table of blocks ({blocks}: _gid, _key and the four counts) and one
-- of groups ({groups}: _gid with its strata, n_used and n_group): the last step of both
-- cal_blocks.sql and the view over cal_blocks_sorted.sql's tables, so both give the same columns.
-- used, unparsed and confidence are read back from _key (a used row's confidence, -1
-- no_confidence, -2 unparsed).
SELECT {by}
       _gid,
       _key >= 0 AS used,
       _key = -2 AS unparsed,
       CASE WHEN _key >= 0 THEN _key END AS confidence,
       n_b, e_b, k_before, e_before, n_used, n_group
FROM {blocks} JOIN {groups} USING (_gid)
