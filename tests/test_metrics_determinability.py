"""Determinability metrics against independent recomputations from raw rows: pandas counts, scipy's
Fisher exact test and Spearman correlation, a hand-enumerated hypergeometric p-value and hand-made
average ranks. Stores are small ClinDet builds with the reference policies plus crafted runs
(several prompt styles, unparsed and off-list labels, partial runs, two samples, self-evaluations)."""

from __future__ import annotations

import json
import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from equipoise.builders.clindet_suite import build_clindet
from equipoise.evaluators.ingest import register as register_config
from equipoise.evaluators.metrics import compute
from equipoise.evaluators.reference_run import run_reference_policies
from equipoise.evaluators.store import connect, insert_table

MET, NOT_MET, UTD = "Met", "Not met", "Unable to determine"
DECISIONS = (MET, NOT_MET, UTD)
CONDS = ("complete", "incomplete_determinable", "incomplete_undeterminable")


# ---------------------------------------------------------------------------------------------
# crafted rows
# ---------------------------------------------------------------------------------------------
def _insert_run(con, run_id, model, style, did, cfg, rows, backend="crafted", decoding=None):
    """rows: (item_id, sample_index, parsed_label or None)."""
    insert_table(
        con,
        "runs",
        pa.Table.from_pylist(
            [
                {
                    "run_id": run_id,
                    "model": model,
                    "backend": backend,
                    "prompt_style": style,
                    "prompt_template_id": "t",
                    "prompt_sha256": "0" * 64,
                    "decoding_json": json.dumps(decoding or {}),
                    "dataset_id": did,
                    "config": cfg,
                    "package_version": "test",
                }
            ]
        ),
    )
    preds = [
        {
            "run_id": run_id,
            "item_id": it,
            "sample_index": s,
            "raw_output": f"Answer: {lab}",
            "parsed_label": lab,
            "parse_method": "answer_line" if lab else "unparsed",
            "outcome": "unparsed" if lab is None else ("abstained" if lab == UTD else "answered"),
        }
        for it, s, lab in rows
    ]
    schema = pa.schema([(k, pa.int32() if k == "sample_index" else pa.string()) for k in preds[0]])
    tbl = pa.Table.from_pylist(preds, schema=schema)
    insert_table(con, "predictions", tbl)


def _items(con):
    return con.execute(
        "SELECT dataset_id, config, item_id, condition, target_label FROM items "
        "WHERE task = 'determinability' ORDER BY item_id"
    ).df()


def _add_random_runs(con, seed):
    rng = np.random.default_rng(seed)
    items = _items(con)
    did, cfg = items.dataset_id[0], items.config[0]
    decision_runs = []
    for mi, model in enumerate(["m-alpha", "m-beta", "m-gamma"]):
        for si, style in enumerate(["base", "cot", "safe"]):
            run_id = f"dec-{seed}-{mi}-{si}"
            samples = 2 if (mi, si) == (0, 1) else 1
            keep = rng.random(len(items)) < (0.75 if (mi, si) == (2, 2) else 1.0)  # one partial run
            # per condition: probabilities of (Met, Not met, UTD, unparsed, off-list label)
            rows = []
            for it, cond, tgt in zip(
                items.item_id[keep], items.condition[keep], items.target_label[keep], strict=True
            ):
                skill = rng.uniform(0.2, 0.9)
                p_abst = 0.1 + 0.15 * si if cond != "incomplete_undeterminable" else 0.2 + 0.25 * si
                for s in range(samples):
                    u = rng.random()
                    if u < 0.04:
                        lab = None
                    elif u < 0.06:
                        lab = "Probably met"  # a label that is not one of the options
                    elif rng.random() < p_abst:
                        lab = UTD
                    elif tgt != UTD and rng.random() < skill:
                        lab = tgt
                    else:
                        lab = rng.choice([MET, NOT_MET])
                    rows.append((it, s, lab))
            _insert_run(con, run_id, model, style, did, cfg, rows)
            decision_runs.append((run_id, model, style, rows))
    # self-evaluations of some decision runs (sample 0 only for the two-sample run); one decision run
    # gets two self-evaluation runs (different decoding): both verdicts count
    for k, (run_id, model, style, rows) in enumerate(decision_runs[:5]):
        n_sev = 2 if k == 2 else 1
        for j in range(n_sev):
            verdicts = []
            for it, s, _lab in rows:
                if s != 0 or rng.random() < 0.1:  # some decisions never judged
                    continue
                v = rng.choice(["Correct", "Incorrect", "Correct", None, "Unsure"])
                verdicts.append((it, s, v))
            _insert_run(
                con, f"sev-{run_id}-{j}", model, f"self_eval:{style}", did, cfg, verdicts, decoding={"t": j}
            )


@pytest.fixture(scope="module", params=[0, 1])
def store(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"det{request.param}")
    folder = root / "ds"
    build_clindet(folder, per_system=4, seed=request.param, progress=False)
    path = root / "s.duckdb"
    con = connect(path)
    run_reference_policies(con, folder, progress=False)
    _add_random_runs(con, request.param)
    con.close()
    return path, folder


def _raw(path):
    con = duckdb.connect(str(path), read_only=True)
    df = con.execute(
        """SELECT r.run_id, r.model, r.backend, r.prompt_style, r.dataset_id, r.config, p.item_id,
                  p.sample_index, p.parsed_label, i.condition, i.system_id, i.target_label
           FROM predictions p JOIN runs r USING (run_id)
           JOIN items i ON i.dataset_id = r.dataset_id AND i.config = r.config AND i.item_id = p.item_id
           WHERE i.task = 'determinability'"""
    ).df()
    con.close()
    return df


def _decisions(raw):
    d = raw[~raw.prompt_style.str.startswith("self_eval:")].copy()
    lab = d.parsed_label
    d["correct"] = (lab == d.target_label).fillna(False).astype(bool)
    d["abstain"] = (lab == UTD).fillna(False).astype(bool)
    d["answered"] = lab.isin([MET, NOT_MET])
    d["unparsed"] = ~lab.isin(DECISIONS)
    return d


def _compute(path, name, by=None, params=None):
    con = duckdb.connect(str(path), read_only=True)
    try:
        return compute(con, name, by, params)
    finally:
        con.close()


# ---------------------------------------------------------------------------------------------
# determinability_accuracy
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("by", [("model", "prompt_style"), ("system_id",), (), ("condition", "model")])
def test_accuracy_matches_pandas(store, by):
    path, _ = store
    d = _decisions(_raw(path))
    keys = [b for b in by if b != "condition"] + ["condition"]
    got = _compute(path, "determinability_accuracy", list(by))
    assert list(got.columns[: len(keys)]) == keys
    got = got.set_index(keys)
    want_groups = d.groupby(keys).size()
    assert len(got) == len(want_groups)
    for key, g in d.groupby(keys):
        # pandas yields 1-tuples when grouping by a one-element list; a flat index wants the scalar
        row = got.loc[key if len(keys) > 1 else key[0]]
        cond = key[-1]
        assert row.n == len(g)
        assert row.n_correct == g.correct.sum()
        assert row.accuracy == pytest.approx(g.correct.mean(), abs=1e-12)
        assert row.unparsed_rate == pytest.approx(g.unparsed.mean(), abs=1e-12)
        if cond == "incomplete_undeterminable":
            assert row.premature_judgment_rate == pytest.approx(g.answered.mean(), abs=1e-12)
            assert np.isnan(row.excessive_abstention_rate) and np.isnan(row.wrong_decision_rate)
            total = row.accuracy + row.premature_judgment_rate + row.unparsed_rate
        else:
            assert np.isnan(row.premature_judgment_rate)
            assert row.excessive_abstention_rate == pytest.approx(g.abstain.mean(), abs=1e-12)
            wrong = g.answered & ~g.correct
            assert row.wrong_decision_rate == pytest.approx(wrong.mean(), abs=1e-12)
            total = row.accuracy + row.excessive_abstention_rate + row.wrong_decision_rate + row.unparsed_rate
        assert total == pytest.approx(1.0, abs=1e-12)  # every sample is counted exactly once


def test_accuracy_excludes_self_evaluation_runs(store):
    path, _ = store
    got = _compute(path, "determinability_accuracy", ["prompt_style"])
    assert set(got.prompt_style) == {"base", "cot", "safe"}


# ---------------------------------------------------------------------------------------------
# determinability_fisher
# ---------------------------------------------------------------------------------------------
def _hypergeom_two_sided(a: int, b: int, c: int, d: int) -> float:
    """Fisher's two-sided p by enumerating every table with the margins of [[a, b], [c, d]]."""
    r1, r2, c1 = a + b, c + d, a + c
    n = r1 + r2

    def prob(x: int) -> float:
        return math.comb(r1, x) * math.comb(r2, c1 - x) / math.comb(n, c1)

    p_obs = prob(a)
    xs = range(max(0, c1 - r2), min(r1, c1) + 1)
    return min(1.0, sum(prob(x) for x in xs if prob(x) <= p_obs * (1 + 1e-7)))


def test_fisher_matches_scipy_on_counts(store):
    path, _ = store
    d = _decisions(_raw(path))
    got = _compute(path, "determinability_fisher")
    assert len(got) == 2 * d.groupby(["model", "prompt_style"]).ngroups
    for row in got.itertuples():
        g = d[(d.model == row.model) & (d.prompt_style == row.prompt_style)]
        inc, ref = g[g.condition == row.condition], g[g.condition == "complete"]
        assert (row.n, row.n_correct) == (len(inc), inc.correct.sum())
        assert (row.n_complete, row.n_correct_complete) == (len(ref), ref.correct.sum())
        table = [
            [row.n_correct, row.n - row.n_correct],
            [row.n_correct_complete, row.n_complete - row.n_correct_complete],
        ]
        res = stats.fisher_exact(table)
        assert row.p_value == pytest.approx(res.pvalue, rel=1e-12, abs=1e-300)
        assert row.odds_ratio == pytest.approx(res.statistic, rel=1e-12, nan_ok=True)
        assert row.significant == (res.pvalue <= 0.05)
        assert row.accuracy_difference == pytest.approx(inc.correct.mean() - ref.correct.mean(), abs=1e-12)
    # alpha is a parameter
    strict = _compute(path, "determinability_fisher", params={"alpha": 1e-6})
    assert (strict.significant == (strict.p_value <= 1e-6)).all()


@pytest.fixture()
def crafted(store, tmp_path):
    """A fresh store with the same items and hand-counted runs."""
    _, folder = store
    con = connect(tmp_path / "crafted.duckdb")
    register_config(con, folder, "all")
    return con


def _answer(items, cond, n_right, n_wrong, n_unparsed=0, n_abstain_wrong=0):
    """Rows for the first items of a condition: n_right correct, n_wrong with the wrong decision (or
    a premature decision when the target is UTD), some unparsed, some wrongly abstaining."""
    sel = items[items.condition == cond].reset_index(drop=True)
    assert len(sel) >= n_right + n_wrong + n_unparsed + n_abstain_wrong
    rows, i = [], 0
    for kind, count in (
        ("right", n_right),
        ("wrong", n_wrong),
        ("none", n_unparsed),
        ("utd", n_abstain_wrong),
    ):
        for _ in range(count):
            tgt = sel.target_label[i]
            if kind == "right":
                lab = tgt
            elif kind == "wrong":
                lab = NOT_MET if tgt == MET else MET
            elif kind == "utd":
                lab = UTD
            else:
                lab = None
            rows.append((sel.item_id[i], 0, lab))
            i += 1
    return rows


def test_fisher_matches_hand_enumerated_hypergeometric(crafted):
    con = crafted
    items = _items(con)
    did, cfg = items.dataset_id[0], items.config[0]
    # complete 9/10 (one unparsed), determinable 5/9 (two abstain, one unparsed), undeterminable 2/11
    rows = (
        _answer(items, "complete", 9, 0, n_unparsed=1)
        + _answer(items, "incomplete_determinable", 5, 1, n_unparsed=1, n_abstain_wrong=2)
        + _answer(items, "incomplete_undeterminable", 2, 9)
    )
    _insert_run(con, "hand", "hand-model", "base", did, cfg, rows)
    got = compute(con, "determinability_fisher").set_index("condition")
    det, und = got.loc["incomplete_determinable"], got.loc["incomplete_undeterminable"]
    assert (det.n_correct, det.n, det.n_correct_complete, det.n_complete) == (5, 9, 9, 10)
    assert (und.n_correct, und.n) == (2, 11)
    assert det.p_value == pytest.approx(_hypergeom_two_sided(5, 4, 9, 1), rel=1e-12)
    assert und.p_value == pytest.approx(_hypergeom_two_sided(2, 9, 9, 1), rel=1e-12)
    # by hand: margins 11 correct / 10 wrong, rows 11 and 10, C(21, 11) = 352716 tables. Tables no
    # more likely than the observed x = 2 (C(11,2) C(10,9) = 550 ways) are x = 1 (11), x = 10 (110)
    # and x = 11 (1): p = (11 + 550 + 110 + 1) / 352716 = 672 / 352716 = 8 / 4199, significant
    assert und.p_value == pytest.approx(8 / 4199, rel=1e-12) and bool(und.significant)
    assert det.odds_ratio == pytest.approx((5 * 1) / (4 * 9))
    assert not bool(det.significant)
    # the accuracy metric sees the same counts, unparsed kept in n
    acc = compute(con, "determinability_accuracy").set_index("condition")
    assert acc.loc["complete", "n"] == 10 and acc.loc["complete", "unparsed_rate"] == pytest.approx(0.1)
    assert acc.loc["incomplete_determinable", "excessive_abstention_rate"] == pytest.approx(2 / 9)
    assert acc.loc["incomplete_undeterminable", "premature_judgment_rate"] == pytest.approx(9 / 11)


def test_fisher_empty_condition_and_refused_grouping(crafted):
    con = crafted
    items = _items(con)
    did, cfg = items.dataset_id[0], items.config[0]
    _insert_run(con, "only-complete", "mc", "base", did, cfg, _answer(items, "complete", 4, 1))
    _insert_run(con, "no-complete", "nc", "base", did, cfg, _answer(items, "incomplete_undeterminable", 3, 3))
    got = compute(con, "determinability_fisher").set_index(["model", "condition"])
    assert got.loc[("mc", "incomplete_undeterminable"), "n"] == 0
    assert np.isnan(got.loc[("mc", "incomplete_undeterminable"), "p_value"])
    assert got.loc[("nc", "incomplete_undeterminable"), "n_complete"] == 0
    assert np.isnan(got.loc[("nc", "incomplete_undeterminable"), "p_value"])
    for bad in (["condition"], ["model", "variant"]):
        with pytest.raises(ValueError, match="compares information conditions"):
            compute(con, "determinability_fisher", bad)
        with pytest.raises(ValueError, match="compares information conditions"):
            compute(con, "determinability_tradeoff", bad)
    # all correct everywhere: p = 1, odds ratio undefined
    _insert_run(
        con,
        "perfect",
        "perfect",
        "base",
        did,
        cfg,
        _answer(items, "complete", 5, 0) + _answer(items, "incomplete_undeterminable", 5, 0),
    )
    row = (
        compute(con, "determinability_fisher")
        .set_index(["model", "condition"])
        .loc[("perfect", "incomplete_undeterminable")]
    )
    assert row.p_value == 1.0 and not bool(row.significant)


# ---------------------------------------------------------------------------------------------
# determinability_tradeoff
# ---------------------------------------------------------------------------------------------
def _average_ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    ranks = [0.0] * len(v)
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _manual_spearman(x, y):
    rx, ry = _average_ranks(list(x)), _average_ranks(list(y))
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    rho = sxy / math.sqrt(sxx * syy)
    df = n - 2
    t2 = rho * rho * df / (1 - rho * rho)
    # two-sided p of Student's t via the regularised incomplete beta function
    from scipy.special import betainc

    return rho, float(betainc(df / 2, 0.5, df / (df + t2)))


@pytest.mark.parametrize("by", [("model", "prompt_style"), ("model",), ("prompt_style", "system_id")])
def test_tradeoff_matches_scipy_and_manual_ranks(store, by):
    path, _ = store
    d = _decisions(_raw(path))
    pts = (
        d[d.condition != "complete"].groupby([*by, "condition"]).correct.mean().unstack("condition").dropna()
    )
    x, y = pts["incomplete_determinable"].to_numpy(), pts["incomplete_undeterminable"].to_numpy()
    assert len(set(x)) < len(x) or len(set(y)) < len(y) or by != ("model", "prompt_style")  # ties present
    got = _compute(path, "determinability_tradeoff", list(by)).iloc[0]
    assert got.n_points == len(pts)
    res = stats.spearmanr(x, y)
    assert got.spearman_rho == pytest.approx(res.statistic, abs=1e-12)
    assert got.p_value == pytest.approx(res.pvalue, rel=1e-9, abs=1e-15)
    rho, p = _manual_spearman(x, y)
    assert got.spearman_rho == pytest.approx(rho, abs=1e-12)
    assert got.p_value == pytest.approx(p, rel=1e-9, abs=1e-15)
    assert got.significant == (p <= 0.05)


def test_tradeoff_too_few_points(store):
    path, _ = store
    got = _compute(path, "determinability_tradeoff", []).iloc[0]
    assert got.n_points == 1 and np.isnan(got.spearman_rho) and np.isnan(got.p_value)


def test_tradeoff_counts_dropped_groups(crafted):
    con = crafted
    items = _items(con)
    did, cfg = items.dataset_id[0], items.config[0]
    for i, (a, b) in enumerate([(1, 3), (2, 2), (3, 1), (4, 4)]):
        rows = _answer(items, "incomplete_determinable", a, 4 - a + (i == 3)) + _answer(
            items, "incomplete_undeterminable", b, 4 - b
        )
        _insert_run(con, f"p{i}", f"pm{i}", "base", did, cfg, rows)
    _insert_run(con, "half", "half", "base", did, cfg, _answer(items, "incomplete_determinable", 1, 1))
    got = compute(con, "determinability_tradeoff").iloc[0]
    assert (got.n_points, got.n_groups_dropped) == (4, 1)
    x, y = [1 / 4, 2 / 4, 3 / 4, 4 / 5], [3 / 4, 2 / 4, 1 / 4, 4 / 4]
    rho, p = _manual_spearman(x, y)
    assert got.spearman_rho == pytest.approx(rho, abs=1e-12) and got.p_value == pytest.approx(p, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# self_eval_filtered_accuracy
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("by", [("model", "prompt_style"), ("model",)])
def test_self_eval_matches_pandas(store, by):
    path, _ = store
    raw = _raw(path)
    d = _decisions(raw)
    v = raw[raw.prompt_style.str.startswith("self_eval:")].copy()
    v["judged_style"] = v.prompt_style.str.slice(len("self_eval:"))
    link = ["model", "backend", "dataset_id", "config", "prompt_style", "item_id", "sample_index"]
    v = v.drop(columns="prompt_style").rename(
        columns={"parsed_label": "verdict", "judged_style": "prompt_style"}
    )
    j = d.merge(v[[*link, "verdict"]], on=link)
    keys = [*by, "condition"]
    got = _compute(path, "self_eval_filtered_accuracy", list(by)).set_index(keys)
    assert len(got) == d.groupby(keys).ngroups
    assert got.n_self_evaluated.sum() == len(j) > 0
    for key, g in d.groupby(keys):
        row = got.loc[key]
        jv = j.set_index(keys).loc[[key]] if key in j.set_index(keys).index else j.iloc[0:0]
        assert row.n == len(g)
        assert row.accuracy == pytest.approx(g.correct.mean(), abs=1e-12)
        assert row.n_self_evaluated == len(jv)
        judged = jv[jv.verdict == "Correct"]
        assert row.n_judged_correct == len(judged)
        assert row.n_verdict_unparsed == (~jv.verdict.isin(["Correct", "Incorrect"])).sum()
        if len(jv):
            assert row.judged_correct_rate == pytest.approx(len(judged) / len(jv), abs=1e-12)
            assert row.accuracy_self_evaluated == pytest.approx(jv.correct.mean(), abs=1e-12)
        else:
            assert np.isnan(row.judged_correct_rate) and np.isnan(row.accuracy_self_evaluated)
        if len(judged):
            assert row.filtered_accuracy == pytest.approx(judged.correct.mean(), abs=1e-12)
        else:
            assert np.isnan(row.filtered_accuracy)


def test_self_eval_without_self_eval_runs_is_null(crafted):
    con = crafted
    items = _items(con)
    did, cfg = items.dataset_id[0], items.config[0]
    _insert_run(con, "d", "solo", "cot", did, cfg, _answer(items, "complete", 3, 1))
    got = compute(con, "self_eval_filtered_accuracy")
    assert len(got) == 1 and got.n[0] == 4 and got.accuracy[0] == 0.75
    assert got.n_self_evaluated[0] == 0 and got.n_judged_correct[0] == 0
    assert got.judged_correct_rate.isna().all() and got.filtered_accuracy.isna().all()
    # a self-evaluation of another prompt style does not link
    _insert_run(
        con,
        "s",
        "solo",
        "self_eval:base",
        did,
        cfg,
        [(r[0], 0, "Correct") for r in _answer(items, "complete", 3, 1)],
    )
    assert compute(con, "self_eval_filtered_accuracy").n_self_evaluated[0] == 0
    verdicts = ["Correct", "Incorrect", "Correct", "Correct"]
    decided = _answer(items, "complete", 3, 1)
    _insert_run(
        con,
        "s2",
        "solo",
        "self_eval:cot",
        did,
        cfg,
        [(r[0], 0, v) for r, v in zip(decided, verdicts, strict=True)],
    )
    got = compute(con, "self_eval_filtered_accuracy").iloc[0]
    # decisions: 3 right then 1 wrong; judged correct: items 1, 3 (right) and 4 (wrong)
    assert got.n_judged_correct == 3 and got.filtered_accuracy == pytest.approx(2 / 3)
    assert got.judged_correct_rate == pytest.approx(3 / 4)
