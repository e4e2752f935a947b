"""Synthetic prediction stores for metric tests and benchmarks (vectorised, seeded).

The store has the real schema and real rows: ``n_items`` MCQ items per config, each config a
variant (gold present or replaced by an abstain option), several models of different skill,
``samples`` samples per item, option log-probabilities for every option, parsed labels drawn from
those probabilities (sample 0 is the argmax, as greedy decoding would give), a small rate of
unparseable outputs, and random strata. It is for exercising metric code at scale, not a model of
any real LLM.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from equipoise.evaluators.store import connect, count_rows, insert_batch, insert_table

SPECIALTIES = ["Cardiology", "Neurology", "Pediatrics", "Gastroenterology", "Infectious Diseases"]
QTYPES = ["diagnosis", "treatment", "diagnostic_test", "definition", "procedure_operation", "other"]
MODALITIES = ["CT", "MRI", "X-ray", "Ultrasound"]
LETTERS = "ABCDEFGH"


@dataclass(frozen=True)
class SyntheticSpec:
    n_items: int = 200
    models: tuple[str, ...] = ("model-a", "model-b")
    configs: tuple[tuple[str, bool], ...] = (("k3_gold", True), ("k3_na", False))  # (name, gold present)
    samples: int = 1
    n_options: int = 4
    unparsed_rate: float = 0.02
    seed: int = 0


def _h(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


def make_store(path: Path, spec: SyntheticSpec) -> dict[str, int]:
    """Write a synthetic store at ``path``; returns row counts per table."""
    rng = np.random.default_rng(spec.seed)
    con = connect(path)
    dataset_id = _h("synthetic", spec)
    n, m = spec.n_items, spec.n_options
    counts: dict[str, int] = {}
    try:
        ds_rows, item_cols, opt_cols = [], {}, {}
        strata = {
            "specialty": rng.choice(SPECIALTIES, n),
            "question_type": rng.choice(QTYPES, n),
            "imaging_modality": rng.choice(MODALITIES, n),
        }
        for cfg, has_gold in spec.configs:
            ds_rows.append(
                {
                    "dataset_id": dataset_id,
                    "config": cfg,
                    "suite": "synthetic",
                    "name": "synthetic",
                    "location": "memory",
                    "builder_version": "synthetic",
                    "seed": spec.seed,
                    "source_name": None,
                    "source_revision": None,
                }
            )
            item_ids = np.array([f"it-{i:07d}:{cfg}" for i in range(n)])
            target_pos = rng.integers(0, m, n)
            cols = {
                "dataset_id": np.full(n, dataset_id),
                "config": np.full(n, cfg),
                "item_id": item_ids,
                "base_id": np.array([f"it-{i:07d}" for i in range(n)]),
                "task": np.full(n, "mcq"),
                "suite": np.full(n, "synthetic"),
                "variant": np.full(n, cfg),
                "target_label": np.array([LETTERS[t] for t in target_pos]),
                "target_role": np.full(n, "gold" if has_gold else "abstain"),
                "has_gold": np.full(n, has_gold),
                "abstain_expected": np.full(n, not has_gold),
                "n_options": np.full(n, m),
                "k": np.full(n, m - 1),
                "framing": np.full(n, None if has_gold else "NA", dtype=object),
                **strata,
            }
            for k, v in cols.items():
                item_cols.setdefault(k, []).append(v)
            # options: the target is gold (or the NA abstain option), the rest distractors
            rep_items = np.repeat(item_ids, m)
            labels = np.tile(np.array(list(LETTERS[:m])), n)
            is_target = np.tile(np.arange(m), n) == np.repeat(target_pos, m)
            role = np.where(is_target, "gold" if has_gold else "abstain", "distractor")
            ocols = {
                "dataset_id": np.full(n * m, dataset_id),
                "config": np.full(n * m, cfg),
                "item_id": rep_items,
                "label": labels,
                "option_id": np.char.add("src:", np.tile(np.arange(m).astype(str), n)),
                "role": role,
                "framing": np.where(is_target & (not has_gold), "NA", None),
            }
            for k, v in ocols.items():
                opt_cols.setdefault(k, []).append(v)
        counts["datasets"] = insert_table(con, "datasets", pa.Table.from_pylist(ds_rows))
        items = pa.table({k: np.concatenate(v) for k, v in item_cols.items()})
        counts["items"] = insert_table(con, "items", items)
        counts["options"] = insert_table(
            con, "options", pa.table({k: np.concatenate(v) for k, v in opt_cols.items()})
        )
        target_by_cfg = {
            cfg: np.array(
                [
                    LETTERS.index(x)
                    for x in items.filter(pa.compute.equal(items["config"], cfg))["target_label"].to_pylist()
                ]
            )
            for cfg, _ in spec.configs
        }
        run_rows = []
        for mi, model in enumerate(spec.models):
            skill = 1.0 + mi  # later models are more accurate
            for cfg, has_gold in spec.configs:
                run_id = _h("run", model, cfg, spec.seed)[:16]
                run_rows.append(
                    {
                        "run_id": run_id,
                        "model": model,
                        "backend": "synthetic",
                        "prompt_style": "base",
                        "prompt_template_id": "synthetic",
                        "prompt_sha256": _h("tpl"),
                        "decoding_json": "{}",
                        "dataset_id": dataset_id,
                        "config": cfg,
                        "package_version": "synthetic",
                    }
                )
                tgt = target_by_cfg[cfg]
                s = spec.samples
                logits = rng.normal(0, 1, (n, s, m))
                logits[np.arange(n), :, tgt] += skill * (0.6 if has_gold else 0.3)
                logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
                prob = np.exp(logp)
                greedy = logp.argmax(-1)
                u = rng.random((n, s, 1))
                sampled = (prob.cumsum(-1) < u).sum(-1).clip(0, m - 1)
                choice = np.where(np.arange(s)[None, :] == 0, greedy, sampled)
                unparsed = rng.random((n, s)) < spec.unparsed_rate
                parsed = np.where(unparsed, None, np.array(list(LETTERS[:m]))[choice]).ravel()
                is_abst = (~unparsed) & (choice == tgt[:, None]) & (not has_gold)
                outcome = np.where(unparsed, "unparsed", np.where(is_abst, "abstained", "answered")).ravel()
                n_tok = rng.integers(1, 300, n * s)
                tok_mean = -rng.gamma(2.0, 0.2, n * s)
                pred = pa.table(
                    {
                        "run_id": np.full(n * s, run_id),
                        "item_id": np.repeat(np.array([f"it-{i:07d}:{cfg}" for i in range(n)]), s),
                        "sample_index": np.tile(np.arange(s), n).astype(np.int32),
                        "raw_output": np.where(
                            unparsed.ravel(), "no idea", np.char.add("Answer: ", parsed.astype(str))
                        ),
                        "parsed_label": parsed,
                        "parse_method": np.where(unparsed.ravel(), "unparsed", "answer_line"),
                        "outcome": outcome,
                        "token_logprob_sum": tok_mean * n_tok,
                        "token_logprob_mean": tok_mean,
                        "token_logprob_min": tok_mean * 3,
                        "n_output_tokens": n_tok.astype(np.int32),
                        "latency_ms": rng.gamma(2.0, 50.0, n * s),
                        "error": np.full(n * s, None, dtype=object),
                    }
                )
                scores = pa.table(
                    {
                        "run_id": np.full(n * s * m, run_id),
                        "item_id": np.repeat(np.array([f"it-{i:07d}:{cfg}" for i in range(n)]), s * m),
                        "sample_index": np.tile(np.repeat(np.arange(s), m), n).astype(np.int32),
                        "label": np.tile(np.array(list(LETTERS[:m])), n * s),
                        "logprob": logp.ravel(),
                    }
                )
                # one batch: the scores are folded into the new predictions' lists (schema v3)
                # (counted within the run: a count of every score would read the whole store per run)
                had = {t: count_rows(con, t, run_id) for t in ("predictions", "option_scores")}
                insert_batch(con, [], tables=[("predictions", pred), ("option_scores", scores)])
                for table, rows_before in had.items():
                    counts[table] = counts.get(table, 0) + count_rows(con, table, run_id) - rows_before
        counts["runs"] = insert_table(con, "runs", pa.Table.from_pylist(run_rows))
    finally:
        con.close()
    return counts
