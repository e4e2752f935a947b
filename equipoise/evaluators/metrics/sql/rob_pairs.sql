-- Paired predictions for the robustness metrics (seed 004 3.4-3.5, 5): a base item (variant
-- '{base_variant}') and a perturbed item (variant '{perturbed_variant}') with the same base_id, in runs
-- sharing dataset_id, model, backend, prompt_style and decoding; one sample of each (sample_index
-- {sample_index}). Correct means the parsed option is the item's target, so under -correct+nota choosing
-- NOTA is correct (it is the target there); unparsed samples are wrong and flagged. Uncertainty of a
-- sample: {uncertainty_doc}. Strata come from the base side (run_id = the base run); the pair views
-- carry the strata of the grouping ({base_strata} the base side's columns of them, besides run_id). Self-evaluation
-- runs (prompt_style 'self_eval:...') are excluded. When several perturbed items share a base_id
-- (e.g. shuffled permutations) every (base, perturbed) pair is a row.
-- Three TEMP views: rob_samples (both variants' samples with their uncertainty), rob_pairs (the
-- pairs) and rob_base_unpaired (base samples with no perturbed partner: left out of the pairs, so
-- the McNemar table reports how many there were instead of dropping them silently).
-- rob_samples carries the side (_is_base: the variant is '{base_variant}'; the filter keeps only the
-- two variants, so false is '{perturbed_variant}') and _unparsed (no parsed role) as booleans: the
-- pair views read those instead of the variant and parsed_role strings, which robustness.py
-- then need not copy into its per-pairing cache.
-- The five run settings that must agree (dataset_id, model, backend, prompt_style, decoding_json)
-- are all columns of `runs`, so they are numbered once per distinct combination over the few runs
-- (pair_class; NULL when one of them is NULL, which `=` never matches either), and samples pair on
-- (pair_class, base_id): a join on one integer and one string instead of six strings, and the
-- samples need not carry the run settings at all.
-- The variant test is the IN list preceded by the range between the two names ({variant_range}:
-- BETWEEN the smaller and the larger in code-point order, true for both under DuckDB's default
-- binary collation, so the same rows; robustness.py leaves the range out on a connection with
-- another default_collation, whose order could differ): DuckDB pushes the range
-- into the scan of scored_probs and fetches the other columns only for the rows in it, where the
-- IN list alone, planned as an OR of equalities, was tested after every sample's columns were
-- read (rob_samples' table about 0.051 -> 0.038 CPU s at 1M predictions, one DuckDB thread).
CREATE OR REPLACE TEMP VIEW rob_samples AS
WITH rc AS (
{run_class}
),
s AS (  -- scored_probs: `scored` with the chosen option's probability, a per-sample fact
    SELECT sc.*, rc.pair_class
    FROM scored_probs sc
    LEFT JOIN rc USING (run_id)
    WHERE sc.sample_index = {sample_index}
      {variant_range}
      AND sc.variant IN ('{base_variant}', '{perturbed_variant}')
      AND NOT starts_with(sc.prompt_style, 'self_eval:')
)
SELECT s.*, {uncertainty_expr} AS uncertainty,
       s.variant = '{base_variant}' AS _is_base,
       s.parsed_role IS NULL        AS _unparsed
FROM s;

CREATE OR REPLACE TEMP VIEW rob_pairs AS
SELECT {base_strata}
       b.run_id, b.base_id,
       b.item_id                    AS base_item_id,
       q.run_id                     AS perturbed_run_id,
       q.item_id                    AS perturbed_item_id,
       b.correct                    AS base_correct,
       q.correct                    AS perturbed_correct,
       b._unparsed                  AS base_unparsed,
       q._unparsed                  AS perturbed_unparsed,
       b.uncertainty                AS base_uncertainty,
       q.uncertainty                AS perturbed_uncertainty
FROM (SELECT * FROM rob_samples WHERE _is_base) b
JOIN (SELECT * FROM rob_samples WHERE NOT _is_base) q
  ON q.pair_class = b.pair_class AND q.base_id = b.base_id;

CREATE OR REPLACE TEMP VIEW rob_base_unpaired AS
SELECT {base_strata}
       b.run_id, b.base_id,
       b.item_id                    AS base_item_id
FROM (SELECT * FROM rob_samples WHERE _is_base) b
ANTI JOIN (SELECT * FROM rob_samples WHERE NOT _is_base) q
  ON q.pair_class = b.pair_class AND q.base_id = b.base_id;
