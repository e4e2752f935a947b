"""Calibration / selective-prediction metrics against independent computations.

References: scikit-learn (roc_auc_score, brier_score_loss, multi-class brier_score_loss), numpy
(ECE and reliability bins via searchsorted, risk-coverage, AURC), exact fractions and brute force over
permutations (AURC random and oracle baselines, tie handling). The per-sample confidences are rebuilt
from the raw tables in pandas (softmax over the scored options), not from the package's views.
"""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.metrics import brier_score_loss, roc_auc_score

from equipoise.evaluators.metrics import compute
from equipoise.evaluators.metrics.calibration import bin_sql
from equipoise.evaluators.metrics.registry import STRATA
from equipoise.evaluators.store import connect, insert_table
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.scores import edit_option_scores

METRICS = ("auroc", "ece", "reliability", "brier", "brier_multiclass", "risk_coverage", "aurc", "prr")
CONFIDENCES = ("chosen_prob", "target_prob", "token_mean")
TOL = 1e-9


# ----------------------------------------------------------------------------------------- stores

# item strata rewritten in the 'damaged' store: column -> SQL literals, chosen by a hash of the item
_VARIED_ITEM_STRATA: dict[str, tuple[str, ...]] = {
    "suite": ("'s1'", "'s2'"),
    "k": ("1", "2", "4", "NULL"),
    "framing": ("'NA'", "'IDK'", "NULL"),
    "system_id": ("'sys1'", "'sys2'", "NULL"),
    "criterion_id": ("'c1'", "'c2'", "'c3'"),
    "condition": ("'cond_a'", "'cond_b'", "NULL"),
    "difficulty": ("'easy'", "'hard'", "NULL"),
}


@pytest.fixture(scope="module", params=["plain", "damaged"])
def store(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cal") / "s.duckdb"
    if request.param == "plain":
        make_store(path, SyntheticSpec(n_items=250, samples=2, seed=0, unparsed_rate=0.05))
    else:
        spec = SyntheticSpec(
            n_items=200, n_options=5, models=("m1", "m2", "m3"), samples=1, seed=7, unparsed_rate=0.1
        )
        make_store(path, spec)
        con = duckdb.connect(str(path))
        # some options unscored (partial coverage, sometimes the chosen or target one), some samples
        # without any score, some without token log-probabilities
        edit_option_scores(
            con,
            "DELETE FROM option_scores WHERE hash(item_id || label || run_id) % 13 = 0",
            "DELETE FROM option_scores WHERE hash(item_id || run_id) % 29 = 0",
        )
        con.execute(
            "UPDATE predictions SET token_logprob_mean = NULL WHERE hash(item_id || run_id || 'x') % 31 = 0"
        )
        # every stratum takes several values (NULL among them where the column is nullable), so a
        # metric grouped by any STRATA column has several groups to get right; `k` in particular
        # varies, because an internal alias `k` once shadowed it
        for col, values in _VARIED_ITEM_STRATA.items():
            cases = " ".join(f"WHEN {i} THEN {v}" for i, v in enumerate(values))
            con.execute(f"UPDATE items SET {col} = CASE hash(item_id || '{col}') % {len(values)} {cases} END")
        con.execute("UPDATE runs SET backend = CASE WHEN model = 'm1' THEN 'b1' ELSE 'b2' END")
        con.execute("UPDATE runs SET prompt_style = CASE WHEN model = 'm3' THEN 'cot' ELSE 'base' END")
        con.close()
    return path


def _tiny_store(path: Path, rows: list[dict]) -> Path:
    """One item per row. Row keys: lp (option log-probs, None = not scored), target (index),
    parsed (index, None = unparsed, or a label string), group (specialty), model, tm (token mean)."""
    con = connect(path)
    letters = "ABCDEFGHIJKL"
    ds = "tinyds"
    items, options, preds, scores, runs = [], [], [], [], {}
    for i, r in enumerate(rows):
        model = r.get("model", "m")
        run_id = f"run-{model}"
        runs[run_id] = {
            "run_id": run_id,
            "model": model,
            "backend": "test",
            "prompt_style": "base",
            "prompt_template_id": "t",
            "prompt_sha256": "0",
            "decoding_json": "{}",
            "dataset_id": ds,
            "config": "c",
            "package_version": "0",
        }
        iid = f"it{i:04d}"
        n = len(r["lp"])
        items.append(
            {
                "dataset_id": ds,
                "config": "c",
                "item_id": iid,
                "base_id": iid,
                "task": "mcq",
                "suite": "tiny",
                "variant": "c",
                "target_label": letters[r["target"]],
                "target_role": "gold",
                "has_gold": True,
                "abstain_expected": False,
                "n_options": n,
                "specialty": r.get("group", "g"),
            }
        )
        for j, lp in enumerate(r["lp"]):
            role = "gold" if j == r["target"] else "distractor"
            options.append(
                {
                    "dataset_id": ds,
                    "config": "c",
                    "item_id": iid,
                    "label": letters[j],
                    "option_id": f"o{j}",
                    "role": role,
                }
            )
            if lp is not None:
                scores.append(
                    {"run_id": run_id, "item_id": iid, "sample_index": 0, "label": letters[j], "logprob": lp}
                )
        parsed = r.get("parsed")
        label = letters[parsed] if isinstance(parsed, int) else parsed
        preds.append(
            {
                "run_id": run_id,
                "item_id": iid,
                "sample_index": 0,
                "raw_output": f"[{label}]",
                "parsed_label": label,
                "parse_method": "test" if label else "unparsed",
                "outcome": "answered" if label else "unparsed",
                "token_logprob_mean": r.get("tm"),
            }
        )
    insert_table(
        con,
        "datasets",
        pa.Table.from_pylist(
            [
                {
                    "dataset_id": ds,
                    "config": "c",
                    "suite": "tiny",
                    "name": "tiny",
                    "location": "memory",
                    "builder_version": "0",
                    "seed": 0,
                }
            ]
        ),
    )
    insert_table(con, "items", pa.Table.from_pylist(items))
    insert_table(con, "options", pa.Table.from_pylist(options))
    insert_table(con, "runs", pa.Table.from_pylist(list(runs.values())))
    preds_t = pa.Table.from_pylist(preds, schema=_PRED_SCHEMA)
    insert_table(con, "predictions", preds_t)
    if scores:
        insert_table(con, "option_scores", pa.Table.from_pylist(scores))
    con.close()
    return path


_PRED_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("item_id", pa.string()),
        ("sample_index", pa.int32()),
        ("raw_output", pa.string()),
        ("parsed_label", pa.string()),
        ("parse_method", pa.string()),
        ("outcome", pa.string()),
        ("token_logprob_mean", pa.float64()),
    ]
)


def _compute(path: Path, name: str, by, params=None) -> pd.DataFrame:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return compute(con, name, by, params)
    finally:
        con.close()


# ------------------------------------------------------------------------- independent reference


@functools.lru_cache(maxsize=16)
def _reference_samples(path: Path, confidence: str, samples: str = "all") -> pd.DataFrame:
    """Per-sample confidence, correctness and status rebuilt from the raw tables in pandas."""
    con = duckdb.connect(str(path), read_only=True)
    tables = {t: con.execute(f"SELECT * FROM {t}").df() for t in ("predictions", "runs", "items", "options")}
    scores = con.execute("SELECT * FROM option_scores").df()
    con.close()
    p = tables["predictions"].merge(tables["runs"], on="run_id")
    p = p.merge(tables["items"], on=["dataset_id", "config", "item_id"], suffixes=("", "_item"))
    if samples == "first":
        p = p[p.sample_index == 0]
    opts = tables["options"][["dataset_id", "config", "item_id", "label"]]
    valid = p.merge(
        opts.rename(columns={"label": "parsed_label"}), on=["dataset_id", "config", "item_id", "parsed_label"]
    )
    key = ["run_id", "item_id", "sample_index"]
    p["parsed_ok"] = p.set_index(key).index.isin(valid.set_index(key).index)
    p["correct"] = (p.parsed_label == p.target_label).fillna(False).astype(bool)
    # softmax over the scored options that are options of the item
    s = scores.merge(tables["runs"][["run_id", "dataset_id", "config"]], on="run_id")
    s = s.merge(opts, on=["dataset_id", "config", "item_id", "label"])
    g = s.groupby(key)["logprob"]
    e = np.exp(s["logprob"] - g.transform("max"))
    s["prob"] = e / e.groupby([s[k] for k in key]).transform("sum")
    if confidence == "token_mean":
        p["conf"] = np.exp(p["token_logprob_mean"])
    else:
        col = "parsed_label" if confidence == "chosen_prob" else "target_label"
        pick = s[[*key, "label", "prob"]].rename(columns={"label": col, "prob": "conf"})
        p = p.merge(pick, on=[*key, col], how="left")
    ok_conf = p["conf"].notna() & (p["conf"] >= 0) & (p["conf"] <= 1)
    p["status"] = np.where(~p.parsed_ok, "unparsed", np.where(ok_conf, "used", "no_confidence"))
    # per sample: how many options were scored, and the probabilities in label order (for the
    # multi-class Brier score, computed by scikit-learn over the fully scored samples)
    mc = (
        s.sort_values([*key, "label"])
        .groupby(key)
        .agg(covered=("prob", "size"), labels=("label", tuple), probs=("prob", tuple))
        .reset_index()
    )
    p = p.merge(mc, on=key, how="left")
    p["full"] = p["covered"] == p["n_options"]
    return p


def _sk_multiclass_brier(full: pd.DataFrame) -> float:
    """Mean multi-class Brier score (sum over options, range [0, 2]) by scikit-learn, one call per
    option set since sklearn needs one shared set of classes; weighted back to a mean over samples."""
    if full.empty:
        return np.nan
    total = 0.0
    for labels, g in full.groupby("labels"):
        probs = np.vstack(g["probs"].to_numpy())
        if len(labels) == 1:  # sklearn needs two classes; a lone option has probability 1
            total += float(((probs[:, 0] - 1.0) ** 2).sum())
        else:
            loss = brier_score_loss(g["target_label"], probs, labels=list(labels), scale_by_half=False)
            total += len(g) * float(loss)
    return total / len(full)


def _ref_bins(c: np.ndarray, n_bins: int) -> np.ndarray:
    return np.searchsorted(np.arange(1, n_bins) / n_bins, c, side="right")


def _ref_ece(y: np.ndarray, c: np.ndarray, n_bins: int = 10):
    b = _ref_bins(c, n_bins)
    rows, ece = [], 0.0
    for k in range(n_bins):
        m = b == k
        acc = y[m].mean() if m.any() else np.nan
        conf = c[m].mean() if m.any() else np.nan
        rows.append((k, int(m.sum()), conf, acc))
        if m.any():
            ece += m.sum() / len(y) * abs(acc - conf)
    return (ece if len(y) else np.nan), rows


def _ref_risk_coverage(y: np.ndarray, c: np.ndarray):
    order = np.argsort(-c, kind="stable")
    cs, err = c[order], 1 - y[order]
    cum = np.cumsum(err)
    ends = np.flatnonzero(np.r_[cs[1:] != cs[:-1], True])
    k = ends + 1
    return cs[ends], k, cum[ends], cum[ends] / k


def _ref_aurc(y: np.ndarray, c: np.ndarray) -> float:
    """Mean over k of E[risk(k)], the expectation over random orders inside tie blocks."""
    _, k_end, e_end, _ = _ref_risk_coverage(y, c)
    k_start = np.r_[0, k_end[:-1]]
    e_start = np.r_[0, e_end[:-1]]
    total = 0.0
    for k0, k1, e0, e1 in zip(k_start, k_end, e_start, e_end, strict=True):
        nb, eb = k1 - k0, e1 - e0
        j = np.arange(1, nb + 1)
        total += float(((e0 + j * eb / nb) / (k0 + j)).sum())
    return total / len(y)


def _oracle_closed_form(n: int, e: int) -> Fraction:
    c = n - e
    return (e - c * sum(Fraction(1, k) for k in range(c + 1, n + 1))) / n


def _aurc_exact(errors: tuple[int, ...]) -> Fraction:
    """The discrete definition on one fixed order (errors listed in acceptance order)."""
    cum, total = 0, Fraction(0)
    for k, err in enumerate(errors, start=1):
        cum += err
        total += Fraction(cum, k)
    return total / len(errors)


def _groups(df: pd.DataFrame, by: list[str]):
    if not by:
        yield (), df
        return
    for key, g in df.groupby(by, dropna=False):
        yield (key if isinstance(key, tuple) else (key,)), g


def _mask(got: pd.DataFrame, by: list[str], key) -> np.ndarray:
    """Rows of ``got`` in the group ``key`` (NULL matches NULL; nullable dtypes such as Int32 too)."""
    m = np.ones(len(got), dtype=bool)
    for col, v in zip(by, key, strict=True):
        m &= got[col].isna().to_numpy() if pd.isna(v) else (got[col] == v).fillna(False).to_numpy(bool)
    return m


def _row(got: pd.DataFrame, by: list[str], key) -> pd.Series:
    m = _mask(got, by, key)
    assert m.sum() == 1, (by, key)
    return got[m].iloc[0]


def _close(a, b) -> bool:
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None or pd.isna(a)
    return abs(float(a) - float(b)) <= TOL


# ---------------------------------------------------------------------------------------- tests


def _check_group(got: dict[str, pd.DataFrame], by: list[str], key: tuple, g: pd.DataFrame) -> None:
    """Every metric's row(s) for one group against the reference samples ``g`` of that group."""
    u = g[g.status == "used"]
    y, c = u.correct.to_numpy().astype(float), u.conf.to_numpy(dtype=float)
    counts = {
        "n_total": len(g),
        "n": len(u),
        "n_excluded": len(g) - len(u),
        "n_unparsed": int((g.status == "unparsed").sum()),
        "n_no_confidence": int((g.status == "no_confidence").sum()),
    }
    for m in ("auroc", "ece", "brier", "aurc", "prr"):
        row = _row(got[m], by, key)
        for col, want in counts.items():
            assert row[col] == want, (m, col, key)
    two = 0 < y.sum() < len(y)
    assert _close(_row(got["auroc"], by, key).auroc, roc_auc_score(y, c) if two else np.nan)
    ece, bins = _ref_ece(y, c)
    assert _close(_row(got["ece"], by, key).ece, ece)
    rel = got["reliability"]
    for b, n_b, conf_b, acc_b in bins:
        r = _row(rel[rel.bin == b], by, key)
        assert r.n == n_b and _close(r.mean_confidence, conf_b) and _close(r.accuracy, acc_b)
        assert _close(r.lower, b / 10) and _close(r.upper, (b + 1) / 10)
        assert r.n_group == len(u) and r.n_excluded == len(g) - len(u)
    brier = brier_score_loss(y, c, pos_label=1) if len(u) else np.nan
    assert _close(_row(got["brier"], by, key).brier, brier)
    # multi-class Brier: scikit-learn on the fully scored samples
    full = g[g.full.fillna(False).astype(bool)]
    mc_row = _row(got["brier_multiclass"], by, key)
    assert mc_row.n == len(full) and mc_row.n_total == len(g)
    assert mc_row.n_partial == int((g.covered.notna() & ~g.full.fillna(False).astype(bool)).sum())
    assert mc_row.n_unscored == int(g.covered.isna().sum())
    assert _close(mc_row.coverage, len(full) / len(g))
    assert _close(mc_row.brier_multiclass, _sk_multiclass_brier(full))
    # risk-coverage steps
    rc = got["risk_coverage"]
    rc = rc[_mask(rc, by, key)].sort_values("n_accepted")
    if len(u):
        thr, k, errs, risk = _ref_risk_coverage(y, c)
        np.testing.assert_allclose(rc.threshold, thr, rtol=0, atol=TOL)
        np.testing.assert_array_equal(rc.n_accepted, k)
        np.testing.assert_array_equal(rc.n_at_threshold, np.diff(np.r_[0, k]))
        np.testing.assert_array_equal(rc.errors, errs)
        np.testing.assert_allclose(rc.risk, risk, rtol=0, atol=TOL)
        np.testing.assert_allclose(rc.coverage, k / len(u), rtol=0, atol=TOL)
        assert (rc.n == len(u)).all() and (rc.n_excluded == len(g) - len(u)).all()
    else:
        assert rc.empty
    # AURC and its baselines
    a = _row(got["aurc"], by, key)
    p = _row(got["prr"], by, key)
    if len(u):
        e = int(len(u) - y.sum())
        aurc = _ref_aurc(y, c)
        oracle = float(_oracle_closed_form(len(u), e))
        assert _close(a.aurc, aurc) and _close(a.aurc_random, e / len(u))
        assert _close(a.aurc_oracle, oracle) and _close(a.e_aurc, aurc - oracle)
        prr = (e / len(u) - aurc) / (e / len(u) - oracle) if two else np.nan
        assert _close(p.prr, prr)
    else:
        assert pd.isna(a.aurc) and pd.isna(p.prr)


def _check_all(got: dict[str, pd.DataFrame], ref: pd.DataFrame, by: list[str]) -> None:
    """Each metric has exactly one row (reliability: n_bins rows) per reference group, grouped by
    ``by`` first, and every group matches the reference."""
    groups = list(_groups(ref, by))
    for m, df in got.items():
        assert list(df.columns[: len(by)]) == by, (m, by)
        if m == "reliability":
            assert len(df) == 10 * len(groups), (m, by)
        elif m != "risk_coverage":
            assert len(df) == len(groups) and df.n_total.sum() == len(ref), (m, by)
    for key, g in groups:
        _check_group(got, by, key, g)
    # no risk-coverage step outside the groups: one per distinct used confidence of each group
    steps = sum(g.conf[g.status == "used"].nunique() for _, g in groups)
    assert len(got["risk_coverage"]) == steps, by


@pytest.mark.parametrize("confidence", CONFIDENCES)
def test_metrics_match_reference(store, confidence):
    """Every confidence on both stores, grouped by two columns at once."""
    by = ["model", "config"]
    ref = _reference_samples(store, confidence)
    got = {m: _compute(store, m, by, {"confidence": confidence}) for m in METRICS}
    _check_all(got, ref, by)


@pytest.mark.parametrize("store", ["damaged"], indirect=True)
def test_every_stratum(store):
    """Every metric grouped by each STRATA column alone, by none, and by a pair that includes ``k``
    (the stratum an internal alias once shadowed), against the reference. The store gives every
    stratum at least two values, so each grouping has groups to get wrong."""
    ref = _reference_samples(store, "chosen_prob")
    for col in STRATA:
        assert ref[col].nunique(dropna=False) >= 2, col
    con = duckdb.connect(str(store), read_only=True)
    try:
        for by in [[col] for col in STRATA] + [[], ["model", "k"]]:
            got = {m: compute(con, m, by) for m in METRICS}
            _check_all(got, ref, by)
    finally:
        con.close()


def test_first_sample_only(store):
    ref = _reference_samples(store, "chosen_prob", samples="first")
    got = _compute(store, "auroc", ["model"], {"samples": "first"})
    for (model,), g in _groups(ref, ["model"]):
        u = g[g.status == "used"]
        row = _row(got, ["model"], (model,))
        assert row.n_total == len(g) and row.n == len(u)
        assert _close(row.auroc, roc_auc_score(u.correct, u.conf))


def test_bin_edges_exact():
    """Bin assignment in SQL equals numpy searchsorted on the edges b/B, their float neighbours,
    0.0 and 1.0 (1.0 in the last bin)."""
    vals = {0.0, 1.0}
    for n_bins in (10, 7, 3, 1):
        for b in range(n_bins + 1):
            e = b / n_bins
            for x in (e, np.nextafter(e, 0), np.nextafter(e, 1), b * (1 / n_bins), e * (1 + 1e-16)):
                if 0 <= x <= 1:
                    vals.add(float(x))
    vals |= {0.3, 0.1 * 3, 0.6, 0.7, 0.1 * 7, 0.2 * 3, 0.9, 0.1 * 9, 1 - 1e-16}
    arr = np.array(sorted(vals))
    con = duckdb.connect()
    con.register("v", pd.DataFrame({"c": arr}))
    for n_bins in (10, 7, 3, 1):
        got = con.execute(f"SELECT {bin_sql('c', n_bins)} AS b FROM v ORDER BY c").df().b.to_numpy()
        np.testing.assert_array_equal(got, _ref_bins(arr, n_bins))
    assert got.max() == 0
    got10 = con.execute(f"SELECT c, {bin_sql('c', 10)} AS b FROM v").df().set_index("c").b
    assert got10[1.0] == 9 and got10[0.0] == 0 and got10[0.3] == 3 and got10[0.1 * 3] == 3
    assert got10[np.nextafter(0.3, 0)] == 2
    con.close()


def _uniform(n: int) -> list[float]:
    return [0.0] * n


EDGE_ROWS = [
    # confidence 1.0 (the other option has probability exactly 0), correct and not
    {"lp": [0.0, -1e4], "target": 0, "parsed": 0},
    {"lp": [0.0, -1e4], "target": 1, "parsed": 0},
    {"lp": [0.0], "target": 0, "parsed": 0},  # one option: 1.0
    # confidence 0.0 (the chosen option has probability exactly 0)
    {"lp": [0.0, -1e4], "target": 1, "parsed": 1},
    {"lp": [0.0, -1e4], "target": 0, "parsed": 1},
    # exact edges 0.1, 0.2, 0.5 and the interior 0.25, 1/3
    {"lp": _uniform(10), "target": 3, "parsed": 3},
    {"lp": _uniform(10), "target": 3, "parsed": 4},
    {"lp": _uniform(5), "target": 0, "parsed": 0},
    {"lp": _uniform(5), "target": 0, "parsed": 1},
    {"lp": _uniform(5), "target": 0, "parsed": 2},
    {"lp": _uniform(4), "target": 0, "parsed": 0},
    {"lp": _uniform(3), "target": 0, "parsed": 1},
    {"lp": _uniform(2), "target": 0, "parsed": 0},
    {"lp": _uniform(2), "target": 0, "parsed": 1},
    # partial coverage: 2 of 3 options scored, chosen one scored -> 0.5, not in brier_multiclass
    {"lp": [0.0, 0.0, None], "target": 0, "parsed": 0},
    # excluded: chosen option not scored, unparsed, label not an option
    {"lp": [0.0, None, 0.0], "target": 0, "parsed": 1},
    {"lp": [0.0, 0.0], "target": 0, "parsed": None},
    {"lp": [0.0, 0.0], "target": 0, "parsed": "Z"},
    # no scores at all
    {"lp": [None, None], "target": 0, "parsed": 0},
]
EDGE_CONF = [1.0, 1.0, 1.0, 0.0, 0.0, 0.1, 0.1, 0.2, 0.2, 0.2, 0.25, 1 / 3, 0.5, 0.5, 0.5]
EDGE_CORRECT = [1, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1]


def test_ece_reliability_edges(tmp_path):
    path = _tiny_store(tmp_path / "edges.duckdb", EDGE_ROWS)
    c, y = np.array(EDGE_CONF), np.array(EDGE_CORRECT, dtype=float)
    ece_want, bins = _ref_ece(y, c)
    ece = _compute(path, "ece", []).iloc[0]
    assert ece.n_total == len(EDGE_ROWS) and ece.n == len(c)
    assert ece.n_excluded == 4 and ece.n_unparsed == 2 and ece.n_no_confidence == 2
    assert _close(ece.ece, ece_want)
    rel = _compute(path, "reliability", []).set_index("bin")
    assert list(rel.index) == list(range(10))
    assert [int(rel.n[b]) for b in range(10)] == [n for _, n, _, _ in bins]
    # 1.0 counted in the last bin, 0.0 in the first, each edge in the bin it opens
    assert rel.n[9] == 3 and rel.n[0] == 2 and rel.n[1] == 2 and rel.n[2] == 4 and rel.n[5] == 3
    assert rel.n.sum() == ece.n
    assert pd.isna(rel.accuracy[4]) and rel.n[4] == 0
    # ECE recomputed from the reliability rows
    nz = rel[rel.n > 0]
    assert _close((nz.n / nz.n.sum() * (nz.accuracy - nz.mean_confidence).abs()).sum(), ece.ece)
    # the variant that drops confidence 1.0 (seed 002's public code) gives a different value
    keep = c < 1.0
    assert abs(_ref_ece(y[keep], c[keep])[0] - ece_want) > 1e-3
    # Brier and AUROC on the same rows
    b = _compute(path, "brier", []).iloc[0]
    assert _close(b.brier, brier_score_loss(y, c, pos_label=1))
    assert _close(_compute(path, "auroc", []).iloc[0].auroc, roc_auc_score(y, c))
    # multi-class Brier: only the fully scored samples (a one-option item included)
    mc = _compute(path, "brier_multiclass", []).iloc[0]
    full = [r for r in EDGE_ROWS if all(x is not None for x in r["lp"])]
    vals = []
    for r in full:
        lp = np.array(r["lp"])
        p = np.exp(lp - lp.max()) / np.exp(lp - lp.max()).sum()
        vals.append(float(((p - (np.arange(len(p)) == r["target"])) ** 2).sum()))
    assert mc.n == len(full) and mc.n_partial == 2 and mc.n_unscored == 1
    assert mc.n_used_unparsed == 2 and _close(mc.coverage, len(full) / len(EDGE_ROWS))
    assert _close(mc.brier_multiclass, np.mean(vals))
    # ECE with another bin count
    e5 = _compute(path, "ece", [], {"n_bins": 5}).iloc[0]
    assert _close(e5.ece, _ref_ece(y, c, 5)[0])


def test_aurc_random_and_oracle_bruteforce():
    """Over every arrangement of E errors among N rows: the mean AURC is E/N (the random baseline,
    exact) and the minimum is the closed form (E - C (H_N - H_C)) / N, reached by rejecting the
    errors first (errors last in acceptance order)."""
    for n in range(1, 9):
        for e in range(n + 1):
            aurcs = [
                _aurc_exact(tuple(int(i in pos) for i in range(n)))
                for pos in itertools.combinations(range(n), e)
            ]
            assert sum(aurcs) / len(aurcs) == Fraction(e, n)
            oracle = _oracle_closed_form(n, e)
            assert min(aurcs) == oracle
            assert _aurc_exact((0,) * (n - e) + (1,) * e) == oracle
            assert max(aurcs) == _aurc_exact((1,) * e + (0,) * (n - e))


TIE_ROWS = (
    # 1.0 x2 (one wrong), 0.5 x3 (two wrong), 1/3 x4 (two wrong), 0.25 x3 (one wrong)
    [{"lp": [0.0, -1e4], "target": 0, "parsed": 0}, {"lp": [0.0, -1e4], "target": 1, "parsed": 0}]
    + [{"lp": _uniform(2), "target": 0, "parsed": int(i > 0)} for i in range(3)]
    + [{"lp": _uniform(3), "target": 0, "parsed": int(i % 2)} for i in range(4)]
    + [{"lp": _uniform(4), "target": 0, "parsed": int(i == 0)} for i in range(3)]
)


def test_aurc_ties_bruteforce(tmp_path):
    """With tied confidences, AURC equals the mean of the discrete AURC over every order that is
    consistent with the confidences (all orders inside each tie block)."""
    path = _tiny_store(tmp_path / "ties.duckdb", TIE_ROWS)
    conf = [1.0, 1.0] + [0.5] * 3 + [1 / 3] * 4 + [0.25] * 3
    err = [*(0, 1), *(0, 1, 1), *(0, 1, 0, 1), *(1, 0, 0)]  # per tie block
    blocks = [[e for c, e in zip(conf, err, strict=True) if c == v] for v in sorted(set(conf), reverse=True)]
    total, count = Fraction(0), 0
    for perm in itertools.product(*(itertools.permutations(b) for b in blocks)):
        total += _aurc_exact(tuple(x for blk in perm for x in blk))
        count += 1
    want = total / count
    got = _compute(path, "aurc", []).iloc[0]
    assert abs(got.aurc - float(want)) <= TOL
    assert abs(got.aurc - _ref_aurc(1 - np.array(err, dtype=float), np.array(conf))) <= TOL
    assert got.n == len(conf) and got.n_errors == sum(err)
    # risk-coverage: one step per distinct confidence
    rc = _compute(path, "risk_coverage", [])
    assert list(rc.n_accepted) == [2, 5, 9, 12] and list(rc.n_at_threshold) == [2, 3, 4, 3]
    assert _close(rc.risk.iloc[-1], sum(err) / len(err)) and _close(rc.coverage.iloc[-1], 1.0)


EXTREME_ROWS = (
    # 'perfect': every correct row more confident than every wrong one
    [{"lp": [0.0, -1e4], "target": 0, "parsed": 0, "group": "perfect"} for _ in range(3)]
    + [{"lp": _uniform(4), "target": 0, "parsed": 1, "group": "perfect"} for _ in range(2)]
    # 'constant': one confidence for all: AURC = random, PRR = 0, AUROC = 0.5
    + [{"lp": _uniform(2), "target": 0, "parsed": i % 2, "group": "constant"} for i in range(5)]
    # 'allcorrect', 'allwrong': one class
    + [{"lp": [0.0, -1.0], "target": 0, "parsed": 0, "group": "allcorrect"} for _ in range(3)]
    + [{"lp": [0.0, -1.0], "target": 1, "parsed": 0, "group": "allwrong"} for _ in range(3)]
    # 'nothing': every row excluded
    + [{"lp": [0.0, 0.0], "target": 0, "parsed": None, "group": "nothing"} for _ in range(2)]
    + [{"lp": [0.0, None], "target": 0, "parsed": 1, "group": "nothing"}]
)


def test_extremes_and_empty_groups(tmp_path):
    path = _tiny_store(tmp_path / "ext.duckdb", EXTREME_ROWS)
    by = ["specialty"]
    res = {
        m: _compute(path, m, by).set_index("specialty")
        for m in METRICS
        if m not in ("reliability", "risk_coverage")
    }
    a, p, au = res["aurc"], res["prr"], res["auroc"]
    oracle = float(_oracle_closed_form(5, 2))
    assert (
        _close(a.aurc["perfect"], oracle)
        and _close(p.prr["perfect"], 1.0)
        and _close(au.auroc["perfect"], 1.0)
    )
    assert (
        _close(a.aurc["constant"], 2 / 5)
        and _close(p.prr["constant"], 0.0)
        and _close(au.auroc["constant"], 0.5)
    )
    for g, risk in (("allcorrect", 0.0), ("allwrong", 1.0)):
        assert pd.isna(au.auroc[g]) and pd.isna(p.prr[g])
        assert _close(a.aurc[g], risk) and _close(a.aurc_oracle[g], risk) and _close(a.aurc_random[g], risk)
    # 'nothing': counted, not dropped; every value NULL
    for m, df in res.items():
        row = df.loc["nothing"]
        assert row.n_total == 3 and row.n_excluded == (1 if m == "brier_multiclass" else 3), m
        if m != "brier_multiclass":
            assert row.n == 0 and row.n_unparsed == 2 and row.n_no_confidence == 1
    for m, col in (("auroc", "auroc"), ("ece", "ece"), ("brier", "brier"), ("aurc", "aurc"), ("prr", "prr")):
        assert pd.isna(res[m].loc["nothing", col]), m
    rel = _compute(path, "reliability", by)
    assert (rel.groupby("specialty").size() == 10).all()
    assert rel[rel.specialty == "nothing"].n.sum() == 0
    rc = _compute(path, "risk_coverage", by)
    assert "nothing" not in set(rc.specialty)


def test_bad_params(store):
    for params in ({"confidence": "max"}, {"samples": "last"}, {"n_bins": 0}, {"n_bins": 2.5}):
        with pytest.raises(ValueError):
            _compute(store, "ece", ["model"], params)
    with pytest.raises(KeyError, match="cannot group by"):
        _compute(store, "auroc", ["correct"])


@pytest.mark.parametrize("by", [["model"], []])
def test_sorted_tie_blocks_keep_their_order_over_many_row_groups_and_threads(by):
    """cal_blocks_sorted.sql reads its window values in the insertion order of a sorted TEMP table
    (a streaming window over one scan), which is how DuckDB runs it but not a documented promise.
    Over 400k rows (four row groups), 4 threads and forced parallelism, where a reordered or
    parallel scan would show, its blocks must be exactly those of the partitioned window
    (cal_blocks.sql): ties, both kinds of excluded rows and a NULL stratum included."""
    from equipoise.evaluators.metrics.calibration import _BLOCKS, _BLOCKS_SORTED, _blocks_values
    from equipoise.evaluators.metrics.registry import render_sql

    con = duckdb.connect()
    con.execute("SET threads = 4")
    con.execute("PRAGMA verify_parallelism")
    # confidence in 1/1000 steps (many ties), every 37th row unparsed, every 41st without one
    con.execute("""
        CREATE TABLE cal_samples AS
        SELECT CASE WHEN i % 5 = 4 THEN NULL ELSE 'm' || (i % 5) END AS model,
               hash(i, 'c') % 3 <> 0 AS correct,
               i % 37 = 0 AS unparsed,
               i % 37 <> 0 AND i % 41 <> 0 AS used,
               CASE WHEN i % 37 <> 0 AND i % 41 <> 0 THEN (hash(i) % 1001) / 1000.0 END AS confidence
        FROM range(400000) t(i)
    """)
    sorted_values = _blocks_values(by, "_b", "_b_groups")
    names = {"blocks": "_b", "groups": "_b_groups", "rows": "_b_rows"}
    con.execute(render_sql(_BLOCKS_SORTED, by, {**sorted_values, **names}))
    con.execute(f"CREATE VIEW blocks_sorted AS {sorted_values['blocks_out']}")
    con.execute(render_sql(_BLOCKS, by, {**_blocks_values(by, "blocks", "gk"), "view": "blocks_windowed"}))

    def columns(view: str) -> list[str]:
        return [c[0] for c in con.execute(f"SELECT * FROM {view} LIMIT 0").description]

    assert columns("blocks_sorted") == columns("blocks_windowed")
    n = con.execute("SELECT count(*), count(*) FILTER (WHERE n_b > 1) FROM blocks_windowed").fetchone()
    assert n[0] > 1000 and n[1] > 100  # many blocks, many of them ties
    for a, b in (("blocks_sorted", "blocks_windowed"), ("blocks_windowed", "blocks_sorted")):
        assert con.execute(f"SELECT count(*) FROM (FROM {a} EXCEPT ALL FROM {b})").fetchone()[0] == 0
