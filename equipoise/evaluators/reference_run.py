"""The main job's evaluation step: every reference policy on every evaluation config, into the store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from equipoise.evaluators.backends.base import Decoding
from equipoise.evaluators.ingest import register
from equipoise.evaluators.policies import ReferenceBackend, policies_for
from equipoise.evaluators.runner import RunSummary, run

# samples per item: the simulated calibrated model also gives sampled answers (sample 0 is its
# greedy answer), so sampling-based scores (consistency, semantic entropy, sampling conformal sets)
# have data on the main job's store
SAMPLES: dict[str, int] = {"calibrated": 5}


def eval_configs(folder: Path) -> list[str]:
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    if manifest["suite"] == "clindet":
        return ["all"]
    return list(manifest.get("eval_configs") or manifest["configs"])


def run_reference_policies(
    con: duckdb.DuckDBPyConnection,
    folder: Path,
    policies: list[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    configs: list[str] | None = None,
) -> list[RunSummary]:
    """One run per (policy, config); idempotent: same run ids, no duplicate rows on a rerun."""
    out = []
    for config in configs or eval_configs(folder):
        loaded = register(con, folder, config)
        task = "determinability" if loaded.suite == "clindet" else "mcq"
        records = {loaded.item_id(r): r for r in loaded.records}
        for name in policies or policies_for(task):
            backend = ReferenceBackend(name, records, seed=seed)
            out.append(
                run(
                    con,
                    folder,
                    config,
                    backend,
                    style="base",
                    decoding=Decoding(n=SAMPLES.get(name, 1), seed=seed),
                    progress=progress,
                    loaded=loaded,
                )
            )
    return out


DETERMINABILITY_SQL = """
SELECT r.model,
       i.condition,
       count(*)                                                              AS n,
       avg(CASE WHEN p.parsed_label = i.target_label THEN 1 ELSE 0 END)      AS accuracy,
       avg(CASE WHEN i.target_role = 'abstain' AND p.outcome = 'answered' THEN 1 ELSE 0 END)
                                                                             AS premature_judgment,
       avg(CASE WHEN i.target_role <> 'abstain' AND p.outcome = 'abstained' THEN 1 ELSE 0 END)
                                                                             AS excessive_abstention,
       avg(CASE WHEN p.outcome IN ('unparsed', 'error') THEN 1 ELSE 0 END)   AS unparsed
FROM predictions p
JOIN runs r USING (run_id)
JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
WHERE i.task = 'determinability'
GROUP BY ALL
ORDER BY r.model, i.condition
"""

# kept for callers of the first release
SUMMARY_SQL = DETERMINABILITY_SQL

MCQ_SQL = """
SELECT i.suite,
       r.model,
       count(DISTINCT r.config)                                              AS configs,
       count(*)                                                              AS n,
       avg(CASE WHEN p.parsed_label = i.target_label THEN 1 ELSE 0 END)      AS accuracy,
       avg(CASE WHEN i.has_gold THEN coalesce(p.parsed_label = i.target_label, false)::INT END)
                                                                             AS acc_gold_present,
       avg(CASE WHEN NOT i.has_gold THEN coalesce(p.parsed_label = i.target_label, false)::INT END)
                                                                             AS acc_gold_absent,
       avg(CASE WHEN p.outcome = 'abstained' THEN 1 ELSE 0 END)              AS abstained,
       avg(CASE WHEN p.outcome IN ('unparsed', 'error') THEN 1 ELSE 0 END)   AS unparsed
FROM predictions p
JOIN runs r USING (run_id)
JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
WHERE i.task = 'mcq'
GROUP BY ALL
ORDER BY i.suite, r.model
"""
