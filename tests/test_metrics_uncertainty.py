"""Uncertainty metrics (unc_scores / unc_normalized / unc_normalization_bounds / unc_combiners /
unc_summary, embedding_scores)
against independent pandas / numpy / scipy / scikit-learn recomputations from the raw store tables.

The random stores are synthetic stores whose outputs are rewritten with reasoning-like text
(questions, 'wait', hedges, confidence statements), repeated sequences, missing log-probabilities,
partly scored options and non-greedy runs. A crafted store shuffles options between the items of one
question so the same option has different letters: clusters must follow option identity.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy.special import logsumexp
from scipy.stats import entropy
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import roc_auc_score

from equipoise.evaluators.metrics import compute
from equipoise.evaluators.metrics.registry import STRATA, prepare
from equipoise.evaluators.metrics.uncertainty import (
    SCORE_COLUMNS,
    UNCERTAINTY_COLUMNS,
    _fit_logistic,
    _fit_ridge,
    _sigmoid,
    combiner_predictions,
    embedding_scores,
)
from equipoise.evaluators.store import connect, insert_table
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.conftest import one_thread_and_forced_parallel
from tests.scores import edit_option_scores

TOL = 1e-9
FRAGMENTS = [
    "Let me think about the murmur.",
    "Is it aortic stenosis?",
    "Wait, that does not fit.",
    "wait... maybe not",
    "WAIT?? Could it be mitral?",
    "Waiting for labs is not an option.",
    "It is probably the second one.",
    "Perhaps it seems likely",
    "I am not sure about this",
    "I'm not\tcertain, it's unlikely.",
    "The likelihood seemed low; notsure",
    "Possibly? apparently; Unsure.",
    "What else??? Hmm?",
    "uncertainty remains, but the answer looks clear.",
]
CONFIDENCE_TAILS = [
    "",
    "",
    "Confidence: 85%",
    "confidence 0.8",
    "CONFIDENCE level = 95 %",
    "Confidence: 7",
    "Confidence: 150%",
    "my confidence is 1",
    "Confidence: 60%\nfinal confidence: 0.35",
]


# ----------------------------------------------------------------------------- stores


def _enrich(path: Path, seed: int) -> None:
    """Rewrite outputs with reasoning-like text, blank some log-probabilities, drop some option
    scores and make runs non-greedy / undecodable."""
    rng = np.random.default_rng(seed + 100)
    con = connect(path)
    try:
        p = con.execute("SELECT run_id, item_id, sample_index FROM predictions ORDER BY ALL").df()
        cands: dict[tuple[str, str], list[str]] = {}
        texts = []
        for run_id, item_id in zip(p.run_id, p.item_id, strict=True):
            if (run_id, item_id) not in cands:
                cands[(run_id, item_id)] = [
                    " ".join(rng.choice(FRAGMENTS, rng.integers(0, 6)).tolist())
                    + rng.choice(["\n", " ", "  "])
                    + str(rng.choice(CONFIDENCE_TAILS))
                    for _ in range(3)
                ]
            texts.append(str(rng.choice(cands[(run_id, item_id)])))  # repeats -> PRO dedup
        n = len(p)
        p["raw_output"] = texts
        p["blank_lp"] = rng.random(n) < 0.05
        p["blank_tok"] = rng.random(n) < 0.04
        p["error"] = rng.random(n) < 0.02  # backend failures: no text, no answer, no log-probs
        p.loc[p["error"], "raw_output"] = ""
        con.register("upd", p)
        con.execute(
            """UPDATE predictions SET raw_output = u.raw_output,
                 token_logprob_sum = CASE WHEN u.blank_lp OR u.error THEN NULL ELSE token_logprob_sum END,
                 token_logprob_mean = CASE WHEN u.blank_lp OR u.error THEN NULL ELSE token_logprob_mean END,
                 token_logprob_min = CASE WHEN u.blank_lp OR u.error THEN NULL ELSE token_logprob_min END,
                 n_output_tokens = CASE WHEN u.blank_tok OR u.error THEN NULL ELSE n_output_tokens END,
                 parsed_label = CASE WHEN u.error THEN NULL ELSE parsed_label END,
                 parse_method = CASE WHEN u.error THEN 'error' ELSE parse_method END,
                 outcome = CASE WHEN u.error THEN 'error' ELSE outcome END,
                 error = CASE WHEN u.error THEN 'HTTP 500' END
               FROM upd u WHERE predictions.run_id = u.run_id AND predictions.item_id = u.item_id
                 AND predictions.sample_index = u.sample_index"""
        )
        con.unregister("upd")
        # options outside the backend's top-k: drop ~10% of option scores
        edit_option_scores(
            con, f"DELETE FROM option_scores WHERE hash(run_id || item_id || label || {seed}) % 10 = 0"
        )
        runs = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY 1").fetchall()]
        con.execute("UPDATE runs SET decoding_json = ? WHERE run_id = ?", ['{"temperature": 0.7}', runs[0]])
        con.execute("UPDATE runs SET decoding_json = ? WHERE run_id = ?", ["not json", runs[1]])
        con.execute("UPDATE runs SET decoding_json = ? WHERE run_id = ?", ['{"temperature": 0}', runs[2]])
    finally:
        con.close()


@pytest.fixture(scope="module", params=[0, 1])
def store(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("unc") / "s.duckdb"
    spec = SyntheticSpec(n_items=120, samples=5, seed=request.param, unparsed_rate=0.1)
    make_store(path, spec)
    _enrich(path, request.param)
    return path


PERMS = [[0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0], [1, 3, 0, 2]]


def _crafted(path: Path) -> Path:
    """Two questions, each offered as four option permutations (items q~p0..p3 sharing base q).

    q1: the model always picks option src:2 (its letter changes with the permutation);
    q2: the model always answers 'A' (position bias: a different option each time), one sample
    unparsed. Two samples per permutation.
    """
    con = connect(path)
    ds, cfg = "ds-shuffle", "shuffled"
    try:
        insert_table(
            con,
            "datasets",
            pa.Table.from_pylist(
                [
                    dict(
                        dataset_id=ds,
                        config=cfg,
                        suite="shuffle",
                        name="crafted",
                        location="memory",
                        builder_version="test",
                        seed=0,
                    )
                ],
            ),
        )
        items, opts, preds, scores = [], [], [], []
        texts = {
            ("q1", 0): "Wait, is it A? Maybe. wait... WAIT? Waiting is not an option. Not sure?? "
            "Answer: C\nConfidence: 85%",
            ("q1", 1): "perhaps it's likely, possibly unlikely; apparently it seems uncertain and "
            "I'm unsure, not\ncertain. confidence 0.8",
            ("q1", 2): "The likelihood seemed low, notsure. CONFIDENCE level = 95 %",
            ("q1", 3): "Confidence: 60% at first\nthen my confidence: 7",
            ("q2", 0): "Confidence: 150%",
            ("q2", 1): "my confidence is 1",
            ("q2", 2): "no statement here",
            ("q2", 3): "",
        }
        for base in ("q1", "q2"):
            for pi, perm in enumerate(PERMS):
                item_id = f"{base}~p{pi}"
                label_of = {f"src:{perm[pos]}": "ABCD"[pos] for pos in range(4)}
                items.append(
                    dict(
                        dataset_id=ds,
                        config=cfg,
                        item_id=item_id,
                        base_id=base,
                        task="mcq",
                        suite="shuffle",
                        variant="shuffled",
                        target_label=label_of["src:0"],
                        target_role="gold",
                        has_gold=True,
                        abstain_expected=False,
                        n_options=4,
                        k=3,
                        specialty="Cardiology",
                    )
                )
                for oid, lab in label_of.items():
                    opts.append(
                        dict(
                            dataset_id=ds,
                            config=cfg,
                            item_id=item_id,
                            label=lab,
                            option_id=oid,
                            role="gold" if oid == "src:0" else "distractor",
                        )
                    )
                for s in range(2):
                    lab = label_of["src:2"] if base == "q1" else "A"
                    unparsed = base == "q2" and pi == 3 and s == 1
                    preds.append(
                        dict(
                            run_id="r1",
                            item_id=item_id,
                            sample_index=s,
                            raw_output=texts[(base, pi)] if s == 0 else f"[{lab}] sample {s}",
                            parsed_label=None if unparsed else lab,
                            parse_method="unparsed" if unparsed else "bracket",
                            outcome="unparsed" if unparsed else "answered",
                            token_logprob_sum=-1.0 - pi - 0.5 * s,
                            token_logprob_mean=-0.1 - 0.01 * pi,
                            token_logprob_min=-0.5 - 0.1 * pi,
                            n_output_tokens=10 + pi,
                        )
                    )
                    for j, lb in enumerate("ABCD"):
                        scores.append(
                            dict(run_id="r1", item_id=item_id, sample_index=s, label=lb, logprob=-1.0 - j)
                        )
        for table, rows in [("items", items), ("options", opts), ("predictions", preds)]:
            insert_table(con, table, pa.Table.from_pylist(rows))
        insert_table(con, "option_scores", pa.Table.from_pylist(scores))
        insert_table(
            con,
            "runs",
            pa.Table.from_pylist(
                [
                    dict(
                        run_id="r1",
                        model="m-shuffle",
                        backend="test",
                        prompt_style="base",
                        prompt_template_id="t",
                        prompt_sha256="x",
                        decoding_json="{}",
                        dataset_id=ds,
                        config=cfg,
                        package_version="test",
                    )
                ]
            ),
        )
    finally:
        con.close()
    return path


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    return _crafted(tmp_path_factory.mktemp("uncc") / "c.duckdb")


def _compute(path: Path, name: str, by, params=None) -> pd.DataFrame:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return compute(con, name, by, params)
    finally:
        con.close()


# ----------------------------------------------------------------------------- reference


def _tables(path: Path) -> dict[str, pd.DataFrame]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {
            t: con.execute(f"SELECT * FROM {t}").df()
            for t in ("predictions", "runs", "items", "options", "option_scores")
        }
    finally:
        con.close()


def _conf(text: str) -> float | None:
    hits = re.findall(r"(?i)\bconfidence\b[^0-9\n]{0,20}?([0-9]+(?:\.[0-9]+)?)\s*(%?)", text)
    if not hits:
        return None
    num, pct = float(hits[-1][0]), hits[-1][1]
    value = num / 100 if pct == "%" or num > 1 else num
    return value if 0 <= value <= 1 else None


HEDGES = {
    "maybe",
    "perhaps",
    "possibly",
    "probably",
    "likely",
    "unlikely",
    "might",
    "unsure",
    "uncertain",
    "seem",
    "seems",
    "seemingly",
    "apparently",
}


def _text_features(text: str) -> dict[str, int]:
    toks = [(m.group().lower(), m.start(), m.end()) for m in re.finditer(r"[A-Za-z0-9_]+", text)]
    hedges = sum(t in HEDGES for t, _, _ in toks)
    for (a, _, e1), (b, s2, _) in itertools.pairwise(toks):
        gap = text[e1:s2]
        hedges += a == "not" and b in ("sure", "certain") and gap != "" and gap.isspace()
    return {
        "n_words": len(text.split()),
        "n_questions": sum(c == "?" and (i == 0 or text[i - 1] != "?") for i, c in enumerate(text)),
        "n_wait": sum(t == "wait" for t, _, _ in toks),
        "n_hedges": hedges,
    }


def _greedy(decoding: str) -> bool | None:
    try:
        d = json.loads(decoding)
    except ValueError:
        return None
    t = d.get("temperature")
    try:
        return float(t if t is not None else 0) == 0
    except (TypeError, ValueError):
        return True


def reference_scores(path: Path, pool: str = "item") -> pd.DataFrame:
    """Every unc_scores column from the raw tables with pandas / numpy / scipy (cached per store)."""
    return _reference_scores(path, pool).copy()


@functools.lru_cache(maxsize=8)
def _reference_scores(path: Path, pool: str) -> pd.DataFrame:
    t = _tables(path)
    p = t["predictions"].merge(t["runs"], on="run_id")
    p = p.merge(t["items"], on=["dataset_id", "config", "item_id"])
    opt = t["options"].set_index(["dataset_id", "config", "item_id", "label"])["option_id"].to_dict()
    p["option_id"] = [
        opt.get((d, c, i, lab)) if isinstance(lab, str) else None
        for d, c, i, lab in zip(p.dataset_id, p.config, p.item_id, p.parsed_label, strict=True)
    ]
    p["cluster"] = p["option_id"].fillna("(no answer)")
    p["correct"] = (p.parsed_label == p.target_label).fillna(False).astype(bool)
    p["pool"] = p["item_id"] if pool == "item" else p["base_id"]
    rows = {}
    for (run_id, _), g in p.groupby(["run_id", "pool"]):
        counts = g["cluster"].value_counts().to_numpy()
        m = len(g)
        seq = g.dropna(subset=["token_logprob_sum"]).groupby(["item_id", "raw_output"])["token_logprob_sum"]
        lp = seq.mean().to_numpy()
        pro = entropy(np.exp(lp - lp.max())) if len(lp) else np.nan
        for item_id in g["item_id"].unique():
            rows[(run_id, item_id)] = {
                "n_samples": m,
                "sample_accuracy": g["correct"].mean(),
                "n_clusters": len(counts),
                "sample_consistency": 1 - counts.max() / m,
                "semantic_entropy": entropy(counts / m),
                "n_pro_sequences": len(lp) if len(lp) else np.nan,
                "pro": pro,
            }
    s0 = p[p.sample_index == 0].copy()
    os0 = t["option_scores"][t["option_scores"].sample_index == 0]
    lse = os0.groupby(["run_id", "item_id"])["logprob"].apply(lambda x: logsumexp(x.to_numpy()))
    ent = os0.groupby(["run_id", "item_id"])["logprob"].apply(
        lambda x: entropy(np.exp(x.to_numpy() - x.max()))
    )
    nsc = os0.groupby(["run_id", "item_id"]).size()
    chosen = os0.set_index(["run_id", "item_id", "label"])["logprob"].to_dict()
    out = []
    for r in s0.itertuples(index=False):
        key = (r.run_id, r.item_id)
        lp_c = chosen.get((r.run_id, r.item_id, r.parsed_label)) if isinstance(r.parsed_label, str) else None
        conf = _conf(r.raw_output)
        row = {
            "model": r.model,
            "config": r.config,
            "run_id": r.run_id,
            "item_id": r.item_id,
            "base_id": r.base_id,
            "outcome": r.outcome,
            "correct": r.correct,
            **rows[key],
            "n_scored_options": nsc.get(key, np.nan),
            "n_options": r.n_options,
            "option_entropy": ent.get(key, np.nan),
            "label_nll": lse[key] - lp_c if lp_c is not None else np.nan,
            "label_nll_raw": -lp_c if lp_c is not None else np.nan,
            "avg_nll": -r.token_logprob_mean,
            "max_nll": -r.token_logprob_min,
            "g_nll": -r.token_logprob_sum,
            "geo_mean_token_prob": np.exp(r.token_logprob_mean),
            "sample0_greedy": _greedy(r.decoding_json),
            "elicited_confidence": conf,
            "elicited_uncertainty": None if conf is None else 1 - conf,
            "n_output_tokens": r.n_output_tokens,
            **_text_features(r.raw_output),
        }
        out.append(row)
    return pd.DataFrame(out).sort_values(["run_id", "item_id"]).reset_index(drop=True)


def _assert_frames(got: pd.DataFrame, want: pd.DataFrame, cols) -> None:
    got = got.sort_values(["run_id", "item_id"]).reset_index(drop=True)
    assert list(got.run_id) == list(want.run_id) and list(got.item_id) == list(want.item_id)
    for c in cols:
        a = pd.to_numeric(got[c], errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(want[c], errors="coerce").to_numpy(dtype=float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), c
        ok = ~np.isnan(a)
        np.testing.assert_allclose(a[ok], b[ok], rtol=1e-12, atol=TOL, err_msg=c)


def _u(key: str) -> float:
    return int(hashlib.md5(key.encode()).hexdigest()[:8], 16) / 2**32


# ----------------------------------------------------------------------------- unc_scores


@pytest.mark.parametrize("pool", ["item", "base"])
def test_scores_match_reference(store, pool):
    got = _compute(store, "unc_scores", ["model", "config"], {"pool": pool})
    want = reference_scores(store, pool)
    assert len(got) == len(want) == 2 * 2 * 120  # every run x item, unparsed/blank rows included
    _assert_frames(got, want, [*SCORE_COLUMNS, "n_samples", "sample_accuracy", "n_clusters"])
    _assert_frames(got, want, ["n_pro_sequences", "n_scored_options", "n_options"])
    assert (got.sort_values(["run_id", "item_id"]).model.to_numpy() == want.model.to_numpy()).all()
    g = got.sort_values(["run_id", "item_id"]).reset_index(drop=True)
    assert g.outcome.tolist() == want.outcome.tolist() and g.correct.tolist() == want.correct.tolist()
    assert g.sample0_greedy.astype(object).where(g.sample0_greedy.notna(), None).tolist() == list(
        want.sample0_greedy
    )
    # the store exercises the NULL paths
    assert g.label_nll.isna().any() and g.avg_nll.isna().any() and g.elicited_confidence.isna().any()
    assert (g.n_scored_options < g.n_options).any() and (g.n_wait > 0).any() and (g.n_hedges > 0).any()
    assert (g.n_pro_sequences < g.n_samples).any()  # repeated sequences merged
    assert (g.outcome == "error").any() and (g.outcome == "unparsed").any()


def test_crafted_shuffle_clusters_by_option_identity(crafted):
    got = _compute(crafted, "unc_scores", ["model"], {"pool": "base"}).set_index("item_id")
    t = _tables(crafted)
    p = t["predictions"].merge(
        t["options"].rename(columns={"label": "parsed_label"}), on=["item_id", "parsed_label"], how="left"
    )
    p["base"] = p.item_id.str.split("~").str[0]
    for _, g in p.groupby("base"):
        by_id = entropy(g.option_id.fillna("(no answer)").value_counts().to_numpy())
        by_letter = entropy(g.parsed_label.fillna("(no answer)").value_counts().to_numpy())
        assert by_id != pytest.approx(by_letter)  # letters would tell a different story
        for item in g.item_id.unique():
            assert got.loc[item, "semantic_entropy"] == pytest.approx(by_id, abs=TOL)
    q1, q2 = got.loc["q1~p0"], got.loc["q2~p0"]
    # q1: one option throughout, under four different letters (C, A, B, D)
    assert q1.n_samples == 8 and q1.n_clusters == 1
    assert q1.semantic_entropy == 0 and q1.sample_consistency == 0
    # q2: always letter A = src:0, src:2, src:3, src:1; one sample unparsed -> its own cluster
    assert q2.n_clusters == 5
    want = -(3 * (2 / 8) * np.log(2 / 8) + 2 * (1 / 8) * np.log(1 / 8))
    assert q2.semantic_entropy == pytest.approx(want, abs=TOL)
    assert q2.sample_consistency == pytest.approx(1 - 2 / 8, abs=TOL)  # tied majorities: share 2/8
    assert q2.sample_accuracy == pytest.approx(2 / 8, abs=TOL)  # src:0 is the target
    # per item, the pool is the item's own two samples
    per_item = _compute(crafted, "unc_scores", ["model"], {"pool": "item"}).set_index("item_id")
    assert (per_item.loc[[f"q1~p{i}" for i in range(4)], "semantic_entropy"] == 0).all()
    assert per_item.loc["q2~p3", "semantic_entropy"] == pytest.approx(np.log(2), abs=TOL)
    assert per_item.loc["q2~p3", "sample_consistency"] == pytest.approx(0.5, abs=TOL)


def test_crafted_text_features_by_hand(crafted):
    got = _compute(crafted, "unc_scores", []).set_index("item_id")
    want = {  # item: (n_wait, n_questions, n_hedges, elicited_confidence)
        "q1~p0": (3, 3, 2, 0.85),
        "q1~p1": (0, 0, 9, 0.8),
        "q1~p2": (0, 0, 0, 0.95),
        "q1~p3": (0, 0, 0, 0.07),
        "q2~p0": (0, 0, 0, None),
        "q2~p1": (0, 0, 0, 1.0),
        "q2~p2": (0, 0, 0, None),
        "q2~p3": (0, 0, 0, None),
    }
    for item, (w, q, h, c) in want.items():
        row = got.loc[item]
        assert (row.n_wait, row.n_questions, row.n_hedges) == (w, q, h), item
        if c is None:
            assert pd.isna(row.elicited_confidence) and pd.isna(row.elicited_uncertainty), item
        else:
            assert row.elicited_confidence == pytest.approx(c, abs=TOL), item
            assert row.elicited_uncertainty == pytest.approx(1 - c, abs=TOL), item
    assert got.loc["q2~p3", "n_words"] == 0
    # label NLL: the chosen letter's softmax over logits -1..-4; G-NLL = -sum of sample 0
    lse = logsumexp([-1.0, -2.0, -3.0, -4.0])
    assert got.loc["q2~p0", "label_nll"] == pytest.approx(lse + 1.0, abs=TOL)
    assert got.loc["q2~p0", "label_nll_raw"] == pytest.approx(1.0, abs=TOL)
    assert got.loc["q1~p2", "g_nll"] == pytest.approx(3.0, abs=TOL)
    assert got.loc["q1~p2", "geo_mean_token_prob"] == pytest.approx(np.exp(-0.12), abs=TOL)
    assert bool(got.loc["q1~p2", "sample0_greedy"]) is True


def test_grouping_and_params(store):
    for by in (["run_id"], ["run_id", "model"], [], ["specialty", "framing", "k"]):
        df = _compute(store, "unc_scores", by)
        assert len(df) == 480 and not df.columns.duplicated().any()
        assert set(by) <= set(df.columns)
    for name in ("unc_normalized", "unc_normalization_bounds", "unc_summary", "unc_combiners"):
        for by in (["run_id"], ["model", "run_id"], []):
            df = _compute(store, name, by)
            assert not df.columns.duplicated().any() and len(df)
    with pytest.raises(ValueError, match="pool"):
        _compute(store, "unc_scores", ["model"], {"pool": "letters"})
    with pytest.raises(ValueError, match="holdout_fraction"):
        _compute(store, "unc_normalized", ["model"], {"holdout_fraction": 1.5})
    with pytest.raises(ValueError, match="scores"):
        _compute(store, "unc_summary", ["model"], {"scores": ["raw_output"]})
    with pytest.raises(KeyError, match="cannot group by"):
        _compute(store, "unc_scores", ["raw_output"])
    assert set(STRATA) >= {"model", "run_id"}


# ----------------------------------------------------------------------------- unc_summary


def test_summary_matches_pandas(store):
    got = _compute(store, "unc_summary", ["model", "config"]).set_index(["model", "config", "score"])
    ref = reference_scores(store)
    assert len(got) == 4 * len(SCORE_COLUMNS)
    for (model, config), g in ref.groupby(["model", "config"]):
        for c in SCORE_COLUMNS:
            v = pd.to_numeric(g[c], errors="coerce").astype(float)
            row = got.loc[(model, config, c)]
            assert row.n_items == len(g) and row.n_scored == v.notna().sum(), c
            if v.notna().any():
                assert row["mean"] == pytest.approx(v.mean(), rel=1e-12, abs=TOL), c
            else:
                assert pd.isna(row["mean"]), c


# ----------------------------------------------------------------------------- normalisation


def test_duckdb_quantiles_match_numpy_methods():
    """quantile_cont is numpy's 'linear' (default) method, quantile_disc its 'inverted_cdf'."""
    rng = np.random.default_rng(7)
    con = duckdb.connect()
    for n in (1, 2, 3, 10, 37, 101):
        x = np.round(rng.normal(size=n), 1)  # ties included
        for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
            c, d = con.execute(
                f"SELECT quantile_cont(x, {q}), quantile_disc(x, {q}) FROM (SELECT unnest($1::DOUBLE[]) x)",
                [x.tolist()],
            ).fetchone()
            assert c == pytest.approx(np.quantile(x, q, method="linear"), abs=1e-12)
            assert d == np.quantile(x, q, method="inverted_cdf")
    con.close()


def _old_formula(raw: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The normalisation as the long unc_normalized rows computed it, element-wise in numpy:
    clip((raw - lo) / (hi - lo), 0, 1); 0 / 1 at or above a degenerate bound; NaN raw or bound -> NaN."""
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = np.where(hi > lo, np.clip((raw - lo) / (hi - lo), 0, 1), np.where(raw <= lo, 0.0, 1.0))
    return np.where(np.isnan(raw) | np.isnan(hi), np.nan, norm)


def _numpy_long(ref: pd.DataFrame, split_key: str, fraction: float, cols=UNCERTAINTY_COLUMNS) -> pd.DataFrame:
    """Independent long rows (model, run_id, item_id, score, in_holdout, raw, n_holdout, lower,
    upper, normalized) from the pandas scores: bounds by numpy over each model's held-out items."""
    long = ref.melt(
        id_vars=["model", "run_id", "item_id", "base_id"],
        value_vars=list(cols),
        var_name="score",
        value_name="raw",
    )
    long["raw"] = pd.to_numeric(long["raw"], errors="coerce").astype(float)
    long["in_holdout"] = [_u(k) < fraction for k in long[split_key]]
    parts = []
    for _, g in long.groupby(["model", "score"]):
        h = g.loc[g.in_holdout, "raw"].dropna().to_numpy()
        g = g.copy()
        lo, hi = (h.min(), np.percentile(h, 99, method="linear")) if len(h) else (np.nan, np.nan)
        g["lower"], g["upper"], g["n_holdout"] = lo, hi, len(h)
        g["normalized"] = _old_formula(g["raw"].to_numpy(), np.full(len(g), lo), np.full(len(g), hi))
        parts.append(g)
    return pd.concat(parts).sort_values(["run_id", "item_id", "score"]).reset_index(drop=True)


def _long(wide: pd.DataFrame, cols) -> pd.DataFrame:
    """The wide metric's score columns as one row per item and score (for comparing)."""
    ids = [c for c in wide.columns if c not in cols]
    long = wide.melt(id_vars=ids, value_vars=list(cols), var_name="score", value_name="normalized")
    return long.sort_values(["run_id", "item_id", "score"]).reset_index(drop=True)


def _bounds_params(params: dict) -> dict:
    return {k: v for k, v in params.items() if k != "include_holdout"}


@pytest.mark.parametrize(("split_key", "fraction"), [("item_id", 0.3), ("base_id", 0.5)])
def test_normalized_matches_numpy(store, split_key, fraction):
    """The wide metric holds, in one column per score, exactly the values the long rows held,
    recomputed here in numpy from the raw tables; unc_normalization_bounds holds their bounds."""
    params = {"holdout_fraction": fraction, "split_key": split_key, "include_holdout": True}
    got = _compute(store, "unc_normalized", ["model"], params)
    bounds = _compute(store, "unc_normalization_bounds", ["model"], _bounds_params(params))
    want = _numpy_long(reference_scores(store), split_key, fraction)
    assert list(got.columns) == ["model", "run_id", "item_id", "in_holdout", *UNCERTAINTY_COLUMNS]
    assert len(got) == 480 and all(got[c].dtype == np.float64 for c in UNCERTAINTY_COLUMNS)
    long = _long(got, UNCERTAINTY_COLUMNS)
    assert len(long) == len(want) == 480 * len(UNCERTAINTY_COLUMNS)
    assert (long[["run_id", "item_id", "score"]] == want[["run_id", "item_id", "score"]]).all().all()
    assert (long.in_holdout.to_numpy() == want.in_holdout.to_numpy()).all()
    a, b = long.normalized.to_numpy(dtype=float), want.normalized.to_numpy(dtype=float)
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-12, atol=TOL)
    ok = long.normalized.dropna()
    assert ok.between(0, 1).all() and (ok == 1).any() and (ok == 0).any()
    # the bounds: one row per (model, score), sorted
    wb = want.drop_duplicates(["model", "score"]).sort_values(["model", "score"]).reset_index(drop=True)
    assert list(bounds.columns) == ["model", "score", "n_holdout", "lower", "upper"]
    assert len(bounds) == len(wb) == want.model.nunique() * len(UNCERTAINTY_COLUMNS)
    assert list(bounds.model) == list(wb.model) and list(bounds.score) == list(wb.score)
    for c in ("n_holdout", "lower", "upper"):
        a, b = bounds[c].to_numpy(dtype=float), wb[c].to_numpy(dtype=float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), c
        np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-12, atol=TOL, err_msg=c)
    # default: held-out rows are not returned
    default = _compute(store, "unc_normalized", ["model"], {k: v for k, v in params.items() if k[0] != "i"})
    assert not default.in_holdout.any() and len(default) == (~got.in_holdout).sum()


@pytest.mark.parametrize("by", [[], ["model"], ["config", "run_id"], ["framing"]])
def test_wide_equals_the_long_formula_on_the_published_scores_and_bounds(store, by):
    """Whatever the grouping (framing is NULL for some items: NULL groups match), each wide cell is
    the long formula applied, here in numpy, to that item's raw score in unc_scores and its group's
    row of unc_normalization_bounds: nothing is lost by no longer publishing raw and bounds per row."""
    cols = ["avg_nll", "semantic_entropy", "n_wait", "elicited_uncertainty"]
    params = {"scores": cols, "include_holdout": True}
    wide = _compute(store, "unc_normalized", by, params)
    bounds = _compute(store, "unc_normalization_bounds", by, _bounds_params(params))
    scores = _compute(store, "unc_scores", by)
    strata = [b for b in by if b != "run_id"]
    raw = scores.melt(
        id_vars=[*strata, "run_id", "item_id"], value_vars=cols, var_name="score", value_name="raw"
    )
    raw["raw"] = pd.to_numeric(raw["raw"], errors="coerce").astype(float)
    # pandas merges NaN keys with NaN keys, as the SQL's IS NOT DISTINCT FROM does
    old = raw.merge(bounds, on=[*by, "score"], how="left", validate="many_to_one")
    assert old.n_holdout.notna().all()
    old["normalized"] = _old_formula(old.raw.to_numpy(), old.lower.to_numpy(), old.upper.to_numpy())
    old = old.sort_values(["run_id", "item_id", "score"]).reset_index(drop=True)
    got = _long(wide, cols)
    assert len(got) == len(old) == 480 * len(cols)
    assert (got[["run_id", "item_id", "score"]] == old[["run_id", "item_id", "score"]]).all().all()
    a, b = got.normalized.to_numpy(dtype=float), old.normalized.to_numpy(dtype=float)
    assert np.array_equal(np.isnan(a), np.isnan(b)) and (~np.isnan(a)).sum() > 100
    np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-12, atol=TOL)
    assert (got.in_holdout.to_numpy() == np.array([_u(i) < 0.3 for i in got.item_id])).all()


def test_normalized_rows_come_sorted(store):
    """One row per item in ORDER BY strata, run_id, item_id order, the score columns in the order
    they were asked for."""
    params = {"scores": ["n_wait", "avg_nll", "semantic_entropy"], "include_holdout": True}
    for by in (["model"], ["config", "run_id"], []):
        got = _compute(store, "unc_normalized", by, params)
        keys = [*(b for b in by if b != "run_id"), "run_id", "item_id"]
        assert list(got.columns) == [*keys, "in_holdout", *params["scores"]]
        assert len(got) == 480
        assert got[keys].equals(got.sort_values(keys)[keys].reset_index(drop=True)), by
        bounds = _compute(store, "unc_normalization_bounds", by, _bounds_params(params))
        bkeys = [*by, "score"]
        assert bounds[bkeys].equals(bounds.sort_values(bkeys)[bkeys].reset_index(drop=True)), by


def test_normalized_degenerate_and_empty_holdout(crafted):
    params = {"include_holdout": True, "holdout_fraction": 0.5}
    got = _compute(crafted, "unc_normalized", ["model"], params)
    bounds = _compute(crafted, "unc_normalization_bounds", ["model"], _bounds_params(params))
    bounds = bounds.set_index(["model", "score"])
    raw = _compute(crafted, "unc_scores", ["model"]).set_index(["run_id", "item_id"])
    # pool 'item': q1 items have 0 entropy, q2 items ln 2 or 0; bounds follow the held-out items
    for r in got.itertuples():
        x = raw.loc[(r.run_id, r.item_id), "semantic_entropy"]
        b = bounds.loc[(r.model, "semantic_entropy")]
        if b.upper > b.lower:
            assert r.semantic_entropy == pytest.approx(min(1, max(0, (x - b.lower) / (b.upper - b.lower))))
        else:
            assert r.semantic_entropy == (0.0 if x <= b.lower else 1.0)
    el = bounds.xs("elicited_uncertainty", level="score")
    raw_el = pd.to_numeric(raw["elicited_uncertainty"], errors="coerce")
    assert el.n_holdout.max() <= 4 and got.elicited_uncertainty.isna().sum() >= raw_el.isna().sum()
    # a group with no defined held-out value: NULL bounds and NULL normalised values throughout
    empty = _compute(crafted, "unc_normalization_bounds", ["run_id"], {"holdout_fraction": 0.01})
    none = empty[empty.n_holdout == 0]
    assert len(none) and none.lower.isna().all() and none.upper.isna().all()
    wide = _compute(
        crafted, "unc_normalized", ["run_id"], {"holdout_fraction": 0.01, "include_holdout": True}
    )
    for r in none.itertuples():
        assert wide.loc[wide.run_id == r.run_id, r.score].isna().all(), (r.run_id, r.score)


# ----------------------------------------------------------------------------- combiners


def _tight_logistic(c: float = 1.0) -> LogisticRegression:
    """scikit-learn's logistic regression run to a tight tolerance: the metric fits the exact
    optimum of the same objective, which the default tol=1e-4 stops some 1e-4 short of."""
    return LogisticRegression(C=c, tol=1e-10, max_iter=10000)


def _reference_combiners(ref: pd.DataFrame, feats, fraction=0.4, c=1.0, alpha=1.0):
    preds, aucs, coefs = {}, {}, {}
    for model, g in ref.groupby("model"):
        g = g.copy()
        g[feats] = g[feats].apply(pd.to_numeric, errors="coerce").astype(float)
        g = g.dropna(subset=feats).sort_values(["run_id", "item_id"])
        y = (~g["correct"].astype(bool)).astype(int).to_numpy()
        tr = np.array([_u(i) < fraction for i in g.item_id])
        x = g[feats].to_numpy()
        lo, hi = x[tr].min(axis=0), x[tr].max(axis=0)
        xs = np.where(hi > lo, (x - lo) / np.where(hi > lo, hi - lo, 1), 0.0)
        out = {"linear_sum": xs.sum(axis=1)}
        lr = _tight_logistic(c).fit(xs[tr], y[tr])
        rg = Ridge(alpha=alpha).fit(xs[tr], y[tr].astype(float))
        out["logistic"] = lr.predict_proba(xs)[:, 1]
        out["ridge"] = rg.predict(xs)
        coefs[model] = {
            **{f"logistic_{f}": v for f, v in zip(feats, lr.coef_[0], strict=True)},
            "logistic_bias": lr.intercept_[0],
            **{f"ridge_{f}": v for f, v in zip(feats, rg.coef_, strict=True)},
            "ridge_bias": rg.intercept_,
        }
        for name, u in out.items():
            preds[(model, name)] = pd.Series(u, index=list(zip(g.run_id, g.item_id, strict=True)))
            aucs[(model, name)] = roc_auc_score(y[~tr], u[~tr])
    return preds, aucs, coefs


@pytest.mark.parametrize(
    "feats", [("n_output_tokens", "n_questions", "n_wait"), ("n_words", "n_wait", "n_hedges", "n_questions")]
)
def test_combiners_match_sklearn(store, feats):
    """Predictions, coefficients and AUROCs against scikit-learn's fits (logistic at a tight
    tolerance) to 1e-6, the benchmark's tolerance against benchmarks/metrics_reference.py."""
    ref = reference_scores(store)
    want_pred, want_auc, want_coef = _reference_combiners(ref, list(feats))
    con = duckdb.connect(str(store), read_only=True)
    try:
        pred, _ = combiner_predictions(con, ["model"], {"features": feats})
    finally:
        con.close()
    for (model, name), w in want_pred.items():
        g = pred[(pred.model == model) & (pred.combiner == name)]
        got = pd.Series(g.u.to_numpy(), index=list(zip(g.run_id, g.item_id, strict=True)))
        assert list(got.index) == list(w.index)
        np.testing.assert_allclose(got.to_numpy(), w.to_numpy(), rtol=0, atol=1e-6, err_msg=name)
    got = _compute(store, "unc_combiners", ["model"], {"features": feats}).set_index("model")
    for (model, name), a in want_auc.items():
        assert got.loc[model, f"auroc_{name}"] == pytest.approx(a, abs=1e-6)
    for model, coefs in want_coef.items():
        for col, v in coefs.items():
            assert got.loc[model, col] == pytest.approx(v, abs=1e-6), (model, col)
    n_missing = ref.groupby("model").apply(lambda g: g[list(feats)].isna().any(axis=1).sum())
    assert (got["n_missing_features"] == n_missing.reindex(got.index)).all()
    assert (got["n_train"] + got["n_test"] + got["n_missing_features"] == got["n_rows"]).all()
    if "n_output_tokens" in feats:
        assert (got["n_missing_features"] > 0).all()  # NULL token counts are counted, not dropped


def test_combiner_group_keys_match_the_fitted_rows(store):
    """unc_combiners fits from rows without the grouping values and takes each group's values from
    a separate sorted list; combiner_predictions reads them off the rows. Both must name every
    group alike, with several strata, NULL strata values (framing) and numbers (k)."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con)
        for by in (["specialty", "framing", "k"], ["framing"], ["model", "run_id"], []):
            fits = combiner_predictions(con, by)[1]
            got = compute(con, "unc_combiners", by)
            assert len(fits) > (1 if by else 0)
            pd.testing.assert_frame_equal(got[list(fits.columns)], fits, check_exact=True)
    finally:
        con.close()


def test_combiner_auroc_equals_sklearn_on_its_own_predictions(store):
    """The SQL Mann-Whitney AUROC (average ranks for ties) against roc_auc_score."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        params = {"features": ("n_questions", "n_wait")}  # small integers: many tied scores
        pred, _ = combiner_predictions(con, ["run_id"], params)
        got = compute(con, "unc_combiners", ["run_id"], params).set_index("run_id")
    finally:
        con.close()
    test = pred[~pred.is_train]
    for (run_id, name), g in test.groupby(["run_id", "combiner"]):
        assert got.loc[run_id, f"auroc_{name}"] == pytest.approx(roc_auc_score(g.incorrect, g.u), abs=TOL)
    per = test.groupby(["run_id", "combiner"]).u
    assert (per.nunique() < per.size() / 3).all()


def test_combiners_single_class_and_empty(crafted):
    """Crafted store: only q2~p0's sample 0 is correct. md5 puts q1~p2 (incorrect) alone below 0.3
    and no item below 0.01."""
    con = duckdb.connect(str(crafted), read_only=True)
    try:
        none = compute(con, "unc_combiners", ["model"], {"train_fraction": 0.01}).iloc[0]
        one = compute(con, "unc_combiners", ["model"], {"train_fraction": 0.3}).iloc[0]
    finally:
        con.close()
    assert (none.n_train, none.n_test, none.n_test_incorrect) == (0, 8, 7)
    assert pd.isna(none.auroc_linear_sum) and pd.isna(none.auroc_logistic) and pd.isna(none.auroc_ridge)
    assert (one.n_train, one.n_train_incorrect, one.n_test, one.n_test_incorrect) == (1, 1, 7, 6)
    # one training class: no logistic fit; ridge and the scaled sum are constant -> AUROC 1/2 (ties)
    assert pd.isna(one.auroc_logistic) and pd.isna(one.get("logistic_bias", np.nan))
    assert one.auroc_ridge == pytest.approx(0.5) and one.auroc_linear_sum == pytest.approx(0.5)


def _penalised_gradient(x: np.ndarray, y: np.ndarray, c: float, w: np.ndarray, b: float) -> np.ndarray:
    """The gradient of 0.5 ||w||^2 + C * sum of log-losses in (w, b), from its textbook form with
    p = 1 / (1 + exp(-z)) (the test's data keep |z| small enough for the plain formula)."""
    p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
    return np.r_[w + c * (x.T @ (p - y)), c * (p - y).sum()]


def _logistic_data(rng: np.random.Generator, n: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Features in [0, 1] (as the combiners' scaled features) with labels that are noisy, perfectly
    separable by the first feature, or separable but for one flipped row."""
    x = rng.random((n, 3))
    if kind == "noisy":
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(x @ np.array([3.0, -2.0, 0.5]) - 0.3)))).astype(int)
    else:
        y = (x[:, 0] > 0.5).astype(int)
        if kind == "nearly":
            y[np.argmax(x[:, 0])] = 0
    return x, y


@pytest.mark.parametrize("kind", ["noisy", "separable", "nearly"])
@pytest.mark.parametrize("c", [1.0, 1e-3, 100.0])
def test_logistic_fit_is_the_penalised_optimum(kind, c):
    """At the fit the penalised objective's gradient is ~0 (relative to its scale C * n), the fit
    agrees with scikit-learn at a tight tolerance to 1e-6, and no coefficient is infinite on
    separable rows: the penalty makes the optimum unique for any finite C."""
    rng = np.random.default_rng(7)
    for n in (12, 400, 5000):
        x, y = _logistic_data(rng, n, kind)
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            w, b = _fit_logistic(x, y, c)
        grad = _penalised_gradient(x, y, c, w, b)
        assert np.abs(grad).max() <= 1e-10 * max(1.0, c * n), (n, grad)
        lr = _tight_logistic(c).fit(x, y)
        np.testing.assert_allclose(w, lr.coef_[0], rtol=0, atol=1e-6)
        assert b == pytest.approx(lr.intercept_[0], abs=1e-6)
        p = _sigmoid(x @ w + b)
        np.testing.assert_allclose(p, lr.predict_proba(x)[:, 1], rtol=0, atol=1e-6)


def test_logistic_fit_is_stable_for_large_margins():
    """Separable rows with a weak penalty (C = 1e6) push the margins far past where exp(z)
    overflows a naive sigmoid; the fit stays finite, raises no floating-point warning, reaches a
    zero gradient and is a minimum: nudging any coefficient raises the objective."""
    rng = np.random.default_rng(3)
    x, y = _logistic_data(rng, 300, "separable")
    c = 1e6
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        w, b = _fit_logistic(x, y, c)
        z = x @ w + b
        p = _sigmoid(z)
    assert np.all(np.isfinite(w)) and np.isfinite(b) and np.abs(z).max() > 40
    assert np.all((p > 0.5) == y.astype(bool))

    def objective(w: np.ndarray, b: float) -> float:
        m = np.where(y == 1, -1.0, 1.0) * (x @ w + b)
        return 0.5 * float(w @ w) + c * float(np.logaddexp(0.0, m).sum())

    e = np.exp(-np.abs(z))  # p (1 - p) and p - y without cancellation at these margins
    resid = np.where(y == 1, -1.0, 1.0) * np.where(np.where(y == 1, -z, z) >= 0, 1 / (1 + e), e / (1 + e))
    grad = np.r_[w + c * (x.T @ resid), c * resid.sum()]
    assert np.abs(grad).max() <= 1e-6 * np.abs(w).max()
    best = objective(w, b)
    for i in range(4):
        for h in (1e-4, -1e-4):
            dw, db = np.zeros(3), 0.0
            if i < 3:
                dw[i] = h
            else:
                db = h
            assert objective(w + dw, b + db) > best


@pytest.mark.parametrize("alpha", [1.0, 0.0, 25.0])
def test_ridge_fit_equals_sklearn(alpha):
    """The closed form with a centred, unpenalised intercept equals scikit-learn's Ridge to ~1e-10,
    with features whose means are far from 0 (where an uncentred intercept column would differ)."""
    rng = np.random.default_rng(11)
    for n in (5, 60, 3000):
        x = rng.random((n, 3)) + np.array([0.0, 10.0, -3.0])
        y = (rng.random(n) < 0.4).astype(int)
        w, b = _fit_ridge(x, y, alpha)
        rg = Ridge(alpha=alpha).fit(x, y.astype(float))
        np.testing.assert_allclose(w, rg.coef_, rtol=0, atol=1e-10)
        assert b == pytest.approx(rg.intercept_, abs=1e-10)


def test_ridge_without_penalty_on_collinear_features_is_the_least_norm_least_squares_fit():
    """alpha = 0 with collinear features (x0 and 1 - x0): many minimisers; the fit is the one of
    least norm (numpy's pseudo-inverse of the centred design, computed independently here), and its
    predictions are least squares."""
    rng = np.random.default_rng(5)
    x0, x1 = rng.random(200), rng.random(200)
    x = np.column_stack([x0, 1.0 - x0, x1])
    y = (rng.random(200) < 0.3).astype(float)
    w, b = _fit_ridge(x, y, 0.0)
    xc, yc = x - x.mean(axis=0), y - y.mean()
    want = np.linalg.pinv(xc) @ yc
    np.testing.assert_allclose(w, want, rtol=0, atol=1e-10)
    assert w[0] == pytest.approx(-w[1], abs=1e-10)  # the least-norm split of the shared direction
    full = np.linalg.lstsq(np.column_stack([x, np.ones(200)]), y, rcond=None)[0]
    np.testing.assert_allclose(x @ w + b, np.column_stack([x, np.ones(200)]) @ full, rtol=0, atol=1e-10)


def test_combiner_parameters_are_checked(store):
    """C must be finite and positive (no optimum otherwise), alpha finite and non-negative; a
    logistic fit needs both labels."""
    for bad in ({"C": 0.0}, {"C": float("inf")}, {"C": -1.0}, {"alpha": -0.5}, {"alpha": float("nan")}):
        with pytest.raises(ValueError, match=r"C must|alpha must"):
            _compute(store, "unc_combiners", ["model"], bad)
    with pytest.raises(ValueError, match="both labels"):
        _fit_logistic(np.zeros((3, 2)), np.ones(3, dtype=int), 1.0)


def test_combiners_do_not_import_sklearn(store):
    """The metrics path fits the combiners in numpy: running unc_combiners leaves scikit-learn
    unimported. In a fresh interpreter, since this test module itself imports it."""
    code = (
        "import sys, duckdb\n"
        "from equipoise.evaluators.metrics import compute\n"
        f"con = duckdb.connect({str(store)!r}, read_only=True)\n"
        "out = compute(con, 'unc_combiners', ['model'])\n"
        "assert len(out) and out['logistic_bias'].notna().all(), out\n"
        "print(sorted(m for m in sys.modules if m == 'sklearn' or m.startswith('sklearn.')))\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "[]", proc.stdout


# ----------------------------------------------------------------------------- embeddings


def _fake_embed(texts):
    return np.stack(
        [
            np.random.default_rng(int(hashlib.md5(t.encode()).hexdigest()[:8], 16)).normal(size=6)
            for t in texts
        ]
    )


@pytest.mark.parametrize("pool", ["item", "base"])
def test_embedding_scores_match_numpy(crafted, store, pool):
    for path in (crafted, store):
        con = duckdb.connect(str(path), read_only=True)
        try:
            got = embedding_scores(con, _fake_embed, by=["model"], pool=pool).set_index(["run_id", "item_id"])
        finally:
            con.close()
        t = _tables(path)
        p = (
            t["predictions"]
            .merge(t["runs"], on="run_id")
            .merge(t["items"], on=["dataset_id", "config", "item_id"])
        )
        p["pool"] = p.item_id if pool == "item" else p.base_id
        n_checked = 0
        for _, g in p.groupby(["run_id", "pool"]):
            ok = g[g.outcome != "error"]
            e = _fake_embed(ok.raw_output.tolist())
            e = e / np.linalg.norm(e, axis=1, keepdims=True)
            ee = float(np.trace(np.atleast_2d(np.cov(e.T, bias=True))))
            rds = float(np.abs(e - e.mean(axis=0)).sum())
            for item in g.item_id.unique():
                row = got.loc[(g.run_id.iloc[0], item)]
                assert row.n_samples == len(g) and row.n_embedded == len(ok)
                assert row.eigen_embed == pytest.approx(ee, abs=TOL)
                assert row.rds == pytest.approx(rds, abs=TOL)
                n_checked += 1
        assert n_checked == len(got)
    with pytest.raises(ValueError, match="shape"):
        con = duckdb.connect(str(crafted), read_only=True)
        try:
            embedding_scores(con, lambda texts: np.zeros((1, 3)))
        finally:
            con.close()


# ----------------------------------------------------------------------------- unc_auroc


@pytest.mark.parametrize("pool", ["item", "base"])
def test_score_auroc_matches_sklearn(store, pool):
    """Per (model, config) and score: sklearn's AUROC of the score for NOT correct, on the items
    where the independent reference defines the score; undefined items are only counted."""
    got = _compute(store, "unc_auroc", ["model", "config"], {"pool": pool})
    want = reference_scores(store, pool)
    assert set(got.score) == set(UNCERTAINTY_COLUMNS)
    checked = 0
    for (model, config, score), row in got.set_index(["model", "config", "score"]).iterrows():
        w = want[(want.model == model) & (want.config == config)]
        u = pd.to_numeric(w[score], errors="coerce").to_numpy(dtype=float)
        y = (~w.correct.astype(bool)).to_numpy()
        ok = ~np.isnan(u)
        assert row.n_items == len(w) and row.n == ok.sum() and row.n_undefined == (~ok).sum()
        assert row.n_incorrect == y[ok].sum()
        if 0 < y[ok].sum() < ok.sum():
            assert row.auroc == pytest.approx(roc_auc_score(y[ok], u[ok]), abs=1e-12), (model, config, score)
            checked += 1
        else:
            assert pd.isna(row.auroc)
    assert checked >= 20


def test_score_auroc_same_whichever_way_a_score_is_counted(store, monkeypatch):
    """unc_auroc counts the discrete scores per distinct value and ranks the others: both ways give
    the same integer Mann-Whitney statistic, so every score put through either way (all counted,
    all ranked) gives exactly the same table, ties, NaN and NULL included."""
    from equipoise.evaluators.metrics import uncertainty

    by = ["model", "config"]
    mixed = _compute(store, "unc_auroc", by)
    assert set(uncertainty.DISCRETE_COLUMNS) & set(mixed.score)  # both ways are in use
    assert set(mixed.score) - set(uncertainty.DISCRETE_COLUMNS)
    for split in ((), SCORE_COLUMNS):
        monkeypatch.setattr(uncertainty, "DISCRETE_COLUMNS", split)
        pd.testing.assert_frame_equal(_compute(store, "unc_auroc", by), mixed, check_exact=True)


def test_score_auroc_single_class_is_null(crafted):
    got = _compute(crafted, "unc_auroc", [], {"scores": ["avg_nll"]})
    assert len(got) == 1
    row = got.iloc[0]
    if row.n_incorrect in (0, row.n):
        assert pd.isna(row.auroc)
    else:
        assert 0.0 <= row.auroc <= 1.0


def test_group_with_null_stratum_matches_sklearn(store):
    """Grouping by a stratum that is NULL for some items (framing): the NULL group is one group,
    as pandas' groupby(dropna=False) makes it, for the count-based AUROC, the normalisation
    bounds and the combiner fits (the metrics number groups internally and join them back)."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con)
        framing = con.execute("SELECT run_id, item_id, framing FROM scored WHERE sample_index = 0").df()
        auc = compute(con, "unc_auroc", ["framing"], {"scores": ["avg_nll", "n_wait"]})
        norm = compute(con, "unc_normalized", ["framing"], {"scores": ["avg_nll"], "include_holdout": True})
        bounds = compute(con, "unc_normalization_bounds", ["framing"], {"scores": ["avg_nll"]})
        comb = compute(con, "unc_combiners", ["framing"])
    finally:
        con.close()
    ref = reference_scores(store).merge(framing, on=["run_id", "item_id"])
    assert ref.framing.isna().any() and ref.framing.notna().any()
    assert auc.framing.isna().sum() == 2 and len(auc) == 2 * ref.framing.nunique(dropna=False)
    for (fr, score), row in auc.set_index(["framing", "score"], drop=False).iterrows():
        g = ref[ref.framing.isna()] if pd.isna(fr) else ref[ref.framing == fr]
        u = pd.to_numeric(g[score], errors="coerce").to_numpy(dtype=float)
        y = (~g.correct.astype(bool)).to_numpy()
        ok = ~np.isnan(u)
        assert row.n_items == len(g) and row.n == ok.sum()
        assert row.auroc == pytest.approx(roc_auc_score(y[ok], u[ok]), abs=1e-12), (fr, score)
    assert len(bounds) == ref.framing.nunique(dropna=False) and bounds.framing.isna().sum() == 1
    for fr, g in norm.groupby("framing", dropna=False):
        r = ref[ref.framing.isna()] if pd.isna(fr) else ref[ref.framing == fr]
        held = np.array([_u(i) < 0.3 for i in r.item_id]) & r.avg_nll.notna().to_numpy()
        b = bounds[bounds.framing.isna()] if pd.isna(fr) else bounds[bounds.framing == fr]
        assert len(g) == len(r) and len(b) == 1 and b.n_holdout.iloc[0] == held.sum()
        assert b.lower.iloc[0] == pytest.approx(r.avg_nll[held].min(), abs=TOL)
    assert len(comb) == 2 and comb.framing.isna().sum() == 1
    assert comb.n_rows.sum() == len(ref)


def _exact_means(con, table: str) -> list[tuple]:
    from equipoise.evaluators.metrics.uncertainty import _exact_mean

    scale, mean = _exact_mean("x")
    return con.execute(
        f"WITH sc AS (SELECT * FROM {table}), scale AS (SELECT {scale} FROM sc) "
        f"SELECT g, {mean} AS m FROM sc CROSS JOIN scale GROUP BY g ORDER BY g"
    ).fetchall()


def test_unc_summary_means_are_the_same_bits_in_any_row_order_and_thread_count() -> None:
    """unc_summary's fixed-point means (uncertainty._exact_mean): the same doubles whatever the rows'
    order and DuckDB's threads (a parallel avg() of these values differs in its last bits), within a
    few ulps of the exact rational mean (fractions), and inf / NaN as avg() gives them."""
    import math
    from fractions import Fraction

    rng = np.random.default_rng(3)
    n = 60_000
    vals = np.concatenate([rng.lognormal(0.0, 3.0, n), -rng.random(n) * 1e-3, rng.random(n) * 7.0])
    groups = rng.integers(0, 3, len(vals))
    frame = pd.DataFrame({"g": groups, "x": vals})
    con = duckdb.connect()
    con.register("frame", frame)
    con.execute("CREATE TABLE a AS SELECT * FROM frame")
    con.execute("CREATE TABLE b AS SELECT * FROM frame ORDER BY x DESC")  # another row order
    con.execute("SET threads = 1")
    one = _exact_means(con, "a")
    con.execute("SET threads = 4")
    con.execute("PRAGMA verify_parallelism")
    assert _exact_means(con, "b") == one and _exact_means(con, "a") == one
    for g, got in one:
        exact = sum(map(Fraction, vals[groups == g].tolist())) / int((groups == g).sum())
        assert math.isclose(got, float(exact), rel_tol=4e-16), (g, got, float(exact))
    con.execute(
        "CREATE TABLE c AS SELECT * FROM (VALUES (0, 1.0), (0, 'inf'::DOUBLE), (1, 'inf'::DOUBLE), "
        "(1, '-inf'::DOUBLE), (2, 'nan'::DOUBLE), (2, 2.0), (3, NULL::DOUBLE), (4, 0.0)) t(g, x)"
    )
    got = dict(_exact_means(con, "c"))
    assert got[0] == math.inf and math.isnan(got[1]) and math.isnan(got[2])
    assert got[3] is None and got[4] == 0.0


@pytest.mark.parametrize("sql_type", ["BIGINT", "INTEGER", "SMALLINT", "UBIGINT"])
def test_unc_summary_integer_means_equal_the_general_form(sql_type: str) -> None:
    """For a column of an integer type _exact_mean leaves out the finiteness test and the avg()
    branch: the same doubles as the general form, which every integer takes (finite as a DOUBLE),
    here with NULLs, an all-NULL and an all-zero group, negative values and values past 2**53."""
    from equipoise.evaluators.metrics.uncertainty import _exact_mean

    rng = np.random.default_rng(11)
    n = 30_000
    big = 2**62 if sql_type in ("BIGINT", "UBIGINT") else 30_000
    low = 0 if sql_type == "UBIGINT" else -big
    drop = rng.random(n) < 0.05  # NULLs inside the populated groups too
    vals = [None if d else int(v) for v, d in zip(rng.integers(low, big, n), drop, strict=True)]
    vals += [None, 0, 0, None]
    groups = [int(g) for g in rng.integers(0, 3, n)] + [3, 4, 4, 5]
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t (g INTEGER, x {sql_type})")
    con.executemany("INSERT INTO t VALUES (?, ?)", list(zip(groups, vals, strict=True)))

    def means(integer: bool) -> list[tuple]:
        scale, mean = _exact_mean("x", integer=integer)
        return con.execute(
            f"WITH sc AS (SELECT * FROM t), scale AS (SELECT {scale} FROM sc) "
            f"SELECT g, {mean} AS m FROM sc CROSS JOIN scale GROUP BY g ORDER BY g"
        ).fetchall()

    general, integer = means(False), means(True)
    assert integer == general and len(general) == 6
    assert dict(general)[3] is None and dict(general)[4] == 0.0
    assert "isfinite" not in _exact_mean("x", integer=True)[1] and "isfinite" in _exact_mean("x")[1]


def test_unc_summary_takes_the_integer_form_for_the_count_scores(store) -> None:
    """unc_summary reads its scores' types: the count scores (integers) get the integer form of
    _exact_mean, the doubles keep the finiteness test (the means themselves are checked against
    pandas by this file's unc_summary tests)."""
    from equipoise.evaluators.metrics.registry import REGISTRY
    from equipoise.evaluators.metrics.uncertainty import _summary_sql

    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con)
        sql = _summary_sql(con, ["model"], dict(REGISTRY["unc_summary"].params))
    finally:
        con.close()
    for col in ("n_output_tokens", "n_words", "n_questions", "n_wait", "n_hedges"):
        assert f"isfinite(CAST({col} AS DOUBLE))" not in sql
    for col in ("avg_nll", "semantic_entropy", "elicited_confidence"):
        assert f"isfinite(CAST({col} AS DOUBLE))" in sql


@pytest.mark.parametrize("pool", ["item", "base"])
def test_embedding_scores_do_not_depend_on_threads(store, pool):
    """EigenEmbed and RDS are sums of doubles (centroids, squared and absolute deviations): with
    one DuckDB thread and with four and parallelism forced onto this small store they are the
    same bits, because every such sum adds a value-sorted list."""
    one, forced = one_thread_and_forced_parallel(
        store, lambda con: embedding_scores(con, _fake_embed, by=["model"], pool=pool)
    )
    assert one["eigen_embed"].notna().sum() > 10
    pd.testing.assert_frame_equal(forced, one, check_exact=True)


def test_unc_summary_literal_scales_give_the_general_bits(store) -> None:
    """Where the scores are a table unc_summary reads each score's scale first and writes it in as
    a literal (uncertainty._literal_means); over plain views the scales stay a CTE of the query
    (_exact_mean). Both give the same frame, bit for bit, for several groupings, and the two forms
    are the ones in use."""
    from equipoise.evaluators.metrics.registry import REGISTRY
    from equipoise.evaluators.metrics.uncertainty import _summary_sql

    params = dict(REGISTRY["unc_summary"].params)
    for by in (["model"], ["model", "config"], []):
        got = {}
        for materialize in (False, True):
            con = duckdb.connect(str(store), read_only=True)
            try:
                prepare(con, materialize=materialize)
                sql = _summary_sql(con, by, params)
                assert ("CROSS JOIN scale" in sql) is not materialize
                got[materialize] = con.execute(sql).df()
            finally:
                con.close()
        pd.testing.assert_frame_equal(got[True], got[False], check_exact=True)


def test_unc_summary_literal_means_equal_the_general_form() -> None:
    """_literal_means against _exact_mean on one table: doubles over many magnitudes, integers of
    several types (past 2**53 too), an all-NULL and an all-zero
    column: the same doubles; a column holding inf or NaN makes it decline (None)."""
    from equipoise.evaluators.metrics.uncertainty import _exact_mean, _literal_means

    rng = np.random.default_rng(5)
    n = 20_000
    frame = pd.DataFrame(
        {
            "g": rng.integers(0, 4, n),
            "d": rng.lognormal(0.0, 4.0, n) * np.where(rng.random(n) < 0.3, -1.0, 1.0),
            "i": rng.integers(-1000, 1000, n).astype(np.int32),
            "big": rng.integers(-(2**60), 2**60, n).astype(np.int64),
            "z": np.zeros(n, dtype=np.int64),
        }
    )
    con = duckdb.connect()
    con.register("frame", frame)
    con.execute("CREATE TABLE t AS SELECT *, NULL::DOUBLE AS nul, NULL::BIGINT AS nul_i FROM frame")
    con.execute("UPDATE t SET d = NULL, i = NULL WHERE g = 3 AND d > 1")  # NULLs inside a group
    cols = ["d", "i", "big", "z", "nul", "nul_i"]
    types = {str(r[0]): str(r[1]) for r in con.execute("DESCRIBE t").fetchall()}
    literal = _literal_means(con, "SELECT * FROM t", cols)
    assert literal is not None
    # the small integers take the direct sum (exact below 2**53), the 2**60 ones the scaled form
    assert literal[cols.index("i")] == "sum(i)::DOUBLE / count(i)"
    assert literal[cols.index("big")] != "sum(big)::DOUBLE / count(big)"
    exact = [_exact_mean(c, integer=types[c] in ("INTEGER", "BIGINT")) for c in cols]
    scales = ", ".join(s for s, _ in exact)
    general = con.execute(
        f"WITH sc AS (SELECT * FROM t), scale AS (SELECT {scales} FROM sc) "
        f"SELECT g, {', '.join(m for _, m in exact)} FROM sc CROSS JOIN scale GROUP BY g ORDER BY g"
    ).fetchall()
    lit = con.execute(f"SELECT g, {', '.join(literal)} FROM t GROUP BY g ORDER BY g").fetchall()
    assert lit == general and len(lit) == 4
    con.execute("CREATE TABLE u AS SELECT * FROM t UNION ALL SELECT 0, 'inf'::DOUBLE, 1, 1, 0, NULL, NULL")
    assert _literal_means(con, "SELECT * FROM u", cols) is None
    con.execute("CREATE TABLE v AS SELECT * FROM t UNION ALL SELECT 0, 'nan'::DOUBLE, 1, 1, 0, NULL, NULL")
    assert _literal_means(con, "SELECT * FROM v", cols) is None


def test_unc_auroc_read_ahead_groups_give_the_joined_bits(store, monkeypatch) -> None:
    """Where the scores are a table unc_auroc reads its groups first: a few are numbered by a CASE
    over their literal values (NULL and integer strata included) and the continuous scores sort
    on a 2-byte partition key; more than _CASE_GROUPS groups, or plain views, number them by a
    join. Every way gives the same frame, bit for bit, as the plain views."""
    from equipoise.evaluators.metrics import uncertainty
    from equipoise.evaluators.metrics.registry import REGISTRY

    params = dict(REGISTRY["unc_auroc"].params)
    seen = set()
    null_group = False
    cases = [(["model"], 8), (["framing"], 8), (["k"], 8), (["model", "framing", "k"], 8)]
    cases += [(["model", "framing"], 1), ([], 8)]
    for by, limit in cases:
        monkeypatch.setattr(uncertainty, "_CASE_GROUPS", limit)
        got = {}
        for materialize in (False, True):
            con = duckdb.connect(str(store), read_only=True)
            try:
                prepare(con, materialize=materialize)
                sql = uncertainty._auroc_sql(con, by, params)
                cased = "SELECT CASE WHEN sc." in sql
                assert not cased or materialize
                seen.add((materialize, cased, "USMALLINT" in sql))
                null_group = null_group or (cased and ".framing IS NULL THEN" in sql)
                got[materialize] = con.execute(sql).df()
            finally:
                con.close()
        pd.testing.assert_frame_equal(got[True], got[False], check_exact=True)
    assert {(True, True, True), (True, False, True), (False, False, False)} <= seen
    assert null_group


def test_unc_auroc_ranks_infinities_apart_from_undefined_scores(store, monkeypatch) -> None:
    """A continuous score holding -inf, +inf (tied among themselves), NULL and NaN next to each
    other: the ranked path (undefined read as NaN, which sorts after +inf) gives the same AUROC as
    the per-value counts and as a brute-force count over every (incorrect, correct) pair of the
    defined items, and the undefined items are counted apart."""
    from equipoise.evaluators.metrics import uncertainty
    from equipoise.evaluators.metrics.registry import REGISTRY

    inf = float("inf")
    values = [-inf, 1.0, 1.0, inf, inf, None, float("nan"), 0.5, inf, -inf, 2.0, None, 1.0, inf]
    wrong = [1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0]
    rows = ", ".join(
        f"('{'ab'[i // 7]}', {'NULL' if v is None else repr(str(v))}::DOUBLE, {not w})"
        for i, (v, w) in enumerate(zip(values, wrong, strict=True))
    )
    params = {**REGISTRY["unc_auroc"].params, "scores": ["avg_nll"]}
    got = {}
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        con.execute(
            f"CREATE TEMP TABLE crafted AS SELECT * FROM (VALUES {rows}) AS t(model, avg_nll, correct)"
        )
        assert con.execute("SELECT count(*) FROM crafted WHERE isnan(avg_nll)").fetchone() == (1,)
        monkeypatch.setattr(uncertainty, "_scores_source", lambda *a, **k: "SELECT * FROM crafted")
        for split in ((), ("avg_nll",)):  # ranked, then counted per value
            monkeypatch.setattr(uncertainty, "DISCRETE_COLUMNS", split)
            sql = uncertainty._auroc_sql(con, ["model"], params)
            got[split] = con.execute(sql).df().set_index("model")
    finally:
        con.close()
    pd.testing.assert_frame_equal(got[()], got[("avg_nll",)], check_exact=True)
    for model, rows in (("a", slice(0, 7)), ("b", slice(7, 14))):
        pairs = [(v, w) for v, w in zip(values[rows], wrong[rows], strict=True) if v is not None and v == v]
        pos = [v for v, w in pairs if w]
        neg = [v for v, w in pairs if not w]
        twice_u = sum(2 * (p > q) + (p == q) for p in pos for q in neg)
        row = got[()].loc[model]
        assert row.n_undefined == 7 - len(pairs) and row.n == len(pairs) and row.n_incorrect == len(pos)
        assert row.auroc == twice_u / (2 * len(pos) * len(neg))


def _auroc_either_way(
    con: duckdb.DuckDBPyConnection, by: list[str], params: dict, sorted_: bool
) -> pd.DataFrame:
    """unc_auroc's frame with its continuous scores ranked by one plain sort read in order
    (``sorted_``, the path of a connection that keeps insertion order) or by the partitioned window
    (insertion order switched off for this connection only)."""
    from equipoise.evaluators.metrics import uncertainty

    if not sorted_:
        con.execute("SET SESSION preserve_insertion_order = false")
    sql = uncertainty._auroc_sql(con, by, params)
    assert ("ORDER BY _part, _v)" in sql) is sorted_
    return con.execute(sql).df()


def test_unc_auroc_sorted_ranks_equal_the_windowed_ranks(store) -> None:
    """unc_auroc ranks its continuous scores by one plain sort read in its order through window
    functions with an empty OVER (unc_auroc_sorted.sql) where the connection keeps insertion
    order, else by a window partitioned by score and group (unc_auroc_windowed.sql). Both give the
    same frame, bit for bit, for several groupings, over plain views and over fixed relations,
    with one thread and with four and parallelism forced, where a sort read out of its order would
    show."""
    from equipoise.evaluators.metrics.registry import REGISTRY

    params = dict(REGISTRY["unc_auroc"].params)

    def run(by: list[str], materialize: bool, sorted_: bool, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
        prepare(con, materialize=materialize)
        return _auroc_either_way(con, by, params, sorted_)

    for by in (["model"], ["model", "config"], []):
        for materialize in (False, True):
            want, _ = one_thread_and_forced_parallel(store, functools.partial(run, by, materialize, False))
            one, forced = one_thread_and_forced_parallel(store, functools.partial(run, by, materialize, True))
            assert want.auroc.notna().sum() >= 2
            pd.testing.assert_frame_equal(one, want, check_exact=True)
            pd.testing.assert_frame_equal(forced, want, check_exact=True)


def test_unc_auroc_sorted_ranks_across_partition_boundaries(store, monkeypatch) -> None:
    """The sorted ranks run over every (group, score) partition in one sequence, in the order of
    the scores within a group, so neighbours of the same value meet across partition boundaries:
    avg_nll's last value (alone) is max_nll's first (tied within max_nll), max_nll's and g_nll's
    undefined scores meet (g_nll has no defined score), pro holds ties of both classes and
    infinities, and label_nll's last value (alone) is option_entropy's first (alone in both). Both
    ways of ranking give the brute-force count over every
    (incorrect, correct) pair of each score's defined items."""
    from equipoise.evaluators.metrics import uncertainty
    from equipoise.evaluators.metrics.registry import REGISTRY

    inf, nan = float("inf"), float("nan")
    wrong = [1, 0, 1, 1, 0, 1]
    scores = {
        "avg_nll": [1.0, 2.0, 2.0, 3.0, 0.5, 2.5],
        "max_nll": [3.0, 3.0, inf, None, 4.0, 3.5],
        "g_nll": [None, nan, None, None, nan, None],
        "pro": [-inf, 0.5, 0.5, inf, inf, 0.5],
        "label_nll": [6.0, 7.0, 8.0, 9.0, 9.5, 10.0],
        "option_entropy": [10.0, 11.0, 12.0, 13.0, 14.0, 15.0],
    }
    assert not set(scores) & set(uncertainty.DISCRETE_COLUMNS)  # every one is ranked
    rows = ", ".join(
        "("
        + ", ".join([*(f"{'NULL' if v is None else repr(str(v))}::DOUBLE" for v in vals), str(not w)])
        + ")"
        for *vals, w in zip(*scores.values(), wrong, strict=True)
    )
    params = {**REGISTRY["unc_auroc"].params, "scores": list(scores)}
    got = {}
    for sorted_ in (True, False):
        con = duckdb.connect(str(store), read_only=True)
        try:
            prepare(con, materialize=True)
            names = ", ".join(scores)
            con.execute(f"CREATE TEMP TABLE crafted AS SELECT * FROM (VALUES {rows}) AS t({names}, correct)")
            monkeypatch.setattr(uncertainty, "_scores_source", lambda *a, **k: "SELECT * FROM crafted")
            got[sorted_] = _auroc_either_way(con, [], params, sorted_).set_index("score")
        finally:
            con.close()
    pd.testing.assert_frame_equal(got[True], got[False], check_exact=True)
    for score, values in scores.items():
        pairs = [(v, w) for v, w in zip(values, wrong, strict=True) if v is not None and v == v]
        pos = [v for v, w in pairs if w]
        neg = [v for v, w in pairs if not w]
        row = got[True].loc[score]
        assert row.n_undefined == len(values) - len(pairs) and row.n_incorrect == len(pos)
        if pos and neg:
            twice_u = sum(2 * (p > q) + (p == q) for p in pos for q in neg)
            assert row.auroc == twice_u / (2 * len(pos) * len(neg)), score
        else:
            assert pd.isna(row.auroc), score
