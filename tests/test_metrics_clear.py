"""CLEAR metrics (humility_deficit, idk_shift, chance_baseline) against an independent pandas recount.

The store holds a real CLEAR build (bundled source, k = 1..2, all six tasks) plus a synthetic suite
whose variants look like CLEAR's (k3_gold / k3_na) but must be ignored by the pairing metrics. Random
predictions are written straight into the store: several models and prompt styles, 1-3 samples per
item, unparseable outputs, backend errors and letters that name no option, runs with items missing
(unpaired), a second gold / NA run under another template (a duplicate partner), a run with other
decoding (never paired) and a self-evaluation run (always excluded). The reference recomputes every
output column from the raw tables with pandas, never through the ``scored`` view.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.evaluators.ingest import register
from equipoise.evaluators.metrics import compute
from equipoise.evaluators.metrics.registry import STRATA
from equipoise.evaluators.store import connect, insert_table
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.conftest import one_thread_and_forced_parallel

NA_KEY = "<NA>"
PAIR_KEY = ["dataset_id", "model", "backend", "prompt_style", "decoding_json", "base_id", "clr_k"]
STRATA_COLS = list(STRATA)  # every column a metric may be grouped by
GROUPINGS = [
    [],
    ["model"],
    ["model", "prompt_style"],
    ["specialty", "question_type"],
    ["run_id"],
    ["config", "difficulty", "imaging_modality"],
    ["backend", "suite", "k", "framing"],
]

# (model, prompt_style, template, decoding seed, configs or None = all, share of items kept)
RUNS = [
    ("m1", "base", "tplA", 0, None, 1.0),
    ("m2", "base", "tplA", 0, None, 0.8),  # items missing on every side: unpaired items
    ("m1", "cot", "tplC", 0, None, 1.0),
    ("m1", "base", "tplB", 0, ["k1_gold", "k1_na", "k1_na_idk"], 1.0),  # second partner run
    ("m1", "base", "tplA", 1, ["k2_idk", "k2_na_ina"], 1.0),  # other decoding: never paired
    ("m1", "self_eval:v1", "tplS", 0, ["k1_gold", "k1_na", "k1_na_idk"], 1.0),  # excluded
]


def _insert_predictions(con: duckdb.DuckDBPyConnection, dataset_id: str, rng: np.random.Generator) -> None:
    """Random predictions for every run in RUNS; vectorised so the fixture stays fast."""
    items = con.execute(
        "SELECT config, item_id, target_label, n_options FROM items WHERE dataset_id = ?", [dataset_id]
    ).df()
    run_rows, preds = [], []
    for ri, (model, style, tpl, dec, configs, keep) in enumerate(RUNS):
        for config in sorted(items.config.unique()) if configs is None else configs:
            run_id = f"run{ri:02d}-{config}"
            run_rows.append(
                {
                    "run_id": run_id,
                    "model": model,
                    "backend": "ref",
                    "prompt_style": style,
                    "prompt_template_id": tpl,
                    "prompt_sha256": tpl * 4,
                    "decoding_json": json.dumps({"seed": dec}),
                    "dataset_id": dataset_id,
                    "config": config,
                    "package_version": "test",
                }
            )
            it = items[items.config == config]
            it = it[rng.random(len(it)) < keep]
            n_samples = rng.integers(1, 4, len(it))
            rep = it.loc[it.index.repeat(n_samples)].reset_index(drop=True)
            rep["sample_index"] = np.concatenate([np.arange(s) for s in n_samples]).astype(np.int32)
            # a per-run lean towards the target so groups differ; then a uniform pick otherwise
            lean = rng.uniform(0.0, 0.6)
            pick = rng.integers(0, rep.n_options.to_numpy())
            letters = np.array([chr(65 + p) for p in pick], dtype=object)
            letters = np.where(rng.random(len(rep)) < lean, rep.target_label.to_numpy(), letters)
            u = rng.random(len(rep))
            kind = np.select([u < 0.08, u < 0.11, u < 0.14], ["unparsed", "error", "bogus"], "ok")
            parsed = np.where(
                np.isin(kind, ["unparsed", "error"]), None, np.where(kind == "bogus", "Z", letters)
            )
            preds.append(
                pd.DataFrame(
                    {
                        "run_id": run_id,
                        "item_id": rep.item_id.to_numpy(),
                        "sample_index": rep.sample_index.to_numpy(),
                        "raw_output": "Answer: " + pd.Series(parsed, dtype=object).fillna("?"),
                        "parsed_label": parsed,
                        "parse_method": np.where(kind == "ok", "answer_line", kind),
                        "outcome": np.where(
                            kind == "error", "error", np.where(kind == "ok", "answered", "unparsed")
                        ),
                    }
                )
            )
    insert_table(con, "runs", pa.Table.from_pylist(run_rows))
    allp = pd.concat(preds, ignore_index=True)
    insert_table(con, "predictions", pa.Table.from_pandas(allp, preserve_index=False))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clear_metrics")
    path = root / "s.duckdb"
    # decoy: suite 'synthetic' with CLEAR-looking variants k3_gold / k3_na
    make_store(path, SyntheticSpec(n_items=40, samples=2, seed=3, unparsed_rate=0.1))
    folder = root / "clear"
    build_mcq_suite("clear", folder, seed=2, max_k=2)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    con = connect(path)
    try:
        loaded = [register(con, folder, c) for c in manifest["eval_configs"]]
        _insert_predictions(con, loaded[0].dataset_id, np.random.default_rng(11))
    finally:
        con.close()
    return path


@pytest.fixture(scope="module")
def raw(store) -> pd.DataFrame:
    """One row per prediction sample with its run, item and parsed option, joined in pandas."""
    con = duckdb.connect(str(store), read_only=True)
    t = {n: con.execute(f"SELECT * FROM {n}").df() for n in ("predictions", "runs", "items", "options")}
    con.close()
    df = (
        t["predictions"]
        .merge(t["runs"], on="run_id")
        .merge(t["items"], on=["dataset_id", "config", "item_id"])
    )
    opts = t["options"][["dataset_id", "config", "item_id", "label", "role", "framing"]].rename(
        columns={"label": "parsed_label", "role": "p_role", "framing": "p_framing"}
    )
    df = df.merge(opts, on=["dataset_id", "config", "item_id", "parsed_label"], how="left")
    assert len(df) == len(t["predictions"])
    df["correct"] = (df.parsed_label == df.target_label).astype(float)
    df["distractor"] = (df.p_role == "distractor").astype(float)
    df["unparsed"] = df.p_role.isna().astype(float)
    for fr in ("NA", "IDK", "INA"):
        df[f"sel_{fr}"] = ((df.p_role == "abstain") & (df.p_framing == fr)).astype(float)
    return df


def _clear_rows(raw: pd.DataFrame) -> pd.DataFrame:
    d = raw[(raw.suite == "clear") & (raw.task == "mcq") & ~raw.prompt_style.str.startswith("self_eval:")]
    parts = d.variant.str.extract(r"^k(\d+)_(.+)$")
    return d.assign(clr_k=parts[0], clr_task=parts[1])


def _reported_items(d: pd.DataFrame, tasks: list[str], values: dict[str, str]) -> pd.DataFrame:
    """Per (run, item) means over samples, keeping strata (NULLs kept as a marker)."""
    d = d[d.clr_task.isin(tasks)]
    keys = ["run_id", "item_id", *PAIR_KEY, "clr_task"]
    strata = [c for c in STRATA_COLS if c not in keys]
    agg = d.groupby(keys, dropna=False).agg(**{k: (v, "mean") for k, v in values.items()})
    first = d.groupby(keys, dropna=False)[strata].first()
    return agg.join(first).reset_index()


def _partner(d: pd.DataFrame, task: str, values: dict[str, str]) -> pd.DataFrame:
    """Partner side pooled over all its samples in every run with the same pairing key."""
    d = d[d.clr_task == task]
    return d.groupby(PAIR_KEY).agg(**{k: (v, "mean") for k, v in values.items()}).reset_index()


def _keyed(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    out = df.copy()
    for c in keys:
        out[c] = out[c].map(
            lambda v: NA_KEY if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)
        )
    return out.set_index(keys).sort_index()


def _compare(got: pd.DataFrame, want: pd.DataFrame, keys: list[str]) -> None:
    g, w = _keyed(got, keys), _keyed(want, keys)
    assert list(g.index) == list(w.index)
    for col in w.columns:
        a = g[col].to_numpy(dtype=float)
        b = w[col].to_numpy(dtype=float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), col
        np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=0, atol=1e-9, err_msg=col)


def _humility_reference(raw: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    d = _clear_rows(raw)
    a = _reported_items(
        d, ["na", "idk", "ina"], {"p_target": "correct", "p_dis": "distractor", "p_unp": "unparsed"}
    )
    g = _partner(d, "gold", {"g_target": "correct", "g_unp": "unparsed"})
    p = a.merge(g, on=PAIR_KEY, how="left", validate="many_to_one")
    assert len(p) == len(a)
    p["k_out"] = p.clr_k.astype(int)
    p["framing_out"] = p.clr_task.str.upper()
    by = [b for b in by if b not in ("k", "framing")]
    rows = []
    for key, grp in p.groupby([*by, "k_out", "framing_out"], dropna=False):
        ok = grp[grp.g_target.notna()]
        rows.append(
            {
                **dict(zip([*by, "k", "framing"], key, strict=True)),
                "n_pairs": len(ok),
                "n_unpaired": len(grp) - len(ok),
                "accuracy": ok.g_target.mean(),
                "abstention_rate": ok.p_target.mean(),
                "humility_deficit": ok.g_target.mean() - ok.p_target.mean(),
                "incorrect_selection_rate": ok.p_dis.mean(),
                "unparsed_rate_gold": ok.g_unp.mean(),
                "unparsed_rate_abstain": ok.p_unp.mean(),
            }
        )
    return pd.DataFrame(rows)


def _idk_reference(raw: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    d = _clear_rows(raw)
    d = d.assign(sel_second=np.where(d.clr_task == "na_idk", d.sel_IDK, d.sel_INA))
    cols = {"dis": "distractor", "na": "sel_NA", "second": "sel_second", "unp": "unparsed"}
    a = _reported_items(d, ["na_idk", "na_ina"], cols)
    b = _partner(
        d,
        "na",
        {
            "b_dis": "distractor",
            "b_na": "sel_NA",
            "b_IDK": "sel_IDK",
            "b_INA": "sel_INA",
            "b_unp": "unparsed",
        },
    )
    p = a.merge(b, on=PAIR_KEY, how="left", validate="many_to_one")
    p["added_framing"] = p.clr_task.str[3:].str.upper()
    p["b_second"] = np.where(p.added_framing == "IDK", p.b_IDK, p.b_INA)
    p["k_out"] = p.clr_k.astype(int)
    by = [b for b in by if b != "k"]
    rows = []
    for key, grp in p.groupby([*by, "k_out", "added_framing"], dropna=False):
        ok = grp[grp.b_na.notna()]
        row = {
            **dict(zip([*by, "k", "added_framing"], key, strict=True)),
            "n_pairs": len(ok),
            "n_unpaired": len(grp) - len(ok),
        }
        for name in ("distractor", "na", "second", "unparsed"):
            short = {"distractor": "dis", "unparsed": "unp"}.get(name, name)
            row[f"p_{name}_before"] = ok[f"b_{short}"].mean()
            row[f"p_{name}_after"] = ok[short].mean()
            row[f"delta_{name}"] = ok[short].mean() - ok[f"b_{short}"].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def _chance_reference(raw: pd.DataFrame, by: list[str], suite: str) -> pd.DataFrame:
    d = raw[(raw.task == "mcq") & ~raw.prompt_style.str.startswith("self_eval:")]
    if suite != "*":
        d = d[d.suite == suite]
    d = d.assign(inv=1.0 / d.n_options, one=1)
    groups = d.groupby(by, dropna=False) if by else [((), d)]
    rows = []
    for key, grp in groups:
        key = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "n": len(grp),
                "chance_accuracy": grp.inv.mean(),
                "accuracy": grp.correct.mean(),
                "accuracy_above_chance": grp.correct.mean() - grp.inv.mean(),
                "min_options": grp.n_options.min(),
                "max_options": grp.n_options.max(),
                "unparsed_rate": grp.unparsed.mean(),
            }
        )
    return pd.DataFrame(rows)


def _compute(store: Path, name: str, by: list[str] | None, params: dict | None = None) -> pd.DataFrame:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return compute(con, name, by, params)
    finally:
        con.close()


def test_fixture_exercises_the_hard_cases(raw):
    """The random store really contains what the comparisons are meant to cover."""
    d = _clear_rows(raw)
    assert d.groupby(["run_id", "item_id"]).size().max() == 3
    assert (d.outcome == "error").any() and (d.parsed_label == "Z").any() and d.parsed_label.isna().any()
    assert d.model.nunique() == 2 and d.prompt_style.nunique() == 2
    assert (raw.suite == "synthetic").any() and raw.prompt_style.str.startswith("self_eval:").any()


@pytest.mark.parametrize("by", GROUPINGS, ids=lambda b: "+".join(b) or "none")
def test_humility_deficit_matches_pandas(store, raw, by):
    got = _compute(store, "humility_deficit", by)
    keys = [b for b in by if b not in ("k", "framing")] + ["k", "framing"]
    assert list(got.columns[: len(keys)]) == keys
    want = _humility_reference(raw, by)
    assert set(got.columns) == set(want.columns)
    _compare(got, want, keys)


@pytest.mark.parametrize("by", GROUPINGS, ids=lambda b: "+".join(b) or "none")
def test_idk_shift_matches_pandas(store, raw, by):
    got = _compute(store, "idk_shift", by)
    keys = [b for b in by if b != "k"] + ["k", "added_framing"]
    want = _idk_reference(raw, by)
    assert set(got.columns) == set(want.columns)
    _compare(got, want, keys)


@pytest.mark.parametrize(
    "by,suite",
    [
        ([], "clear"),
        (["model", "prompt_style", "variant"], "clear"),
        (["suite", "model"], "*"),
        (["specialty", "run_id"], "*"),
        (["variant"], "synthetic"),
    ],
)
def test_chance_baseline_matches_pandas(store, raw, by, suite):
    got = _compute(store, "chance_baseline", by, {"suite": suite})
    want = _chance_reference(raw, by, suite)
    assert set(got.columns) == set(want.columns)
    if by:
        _compare(got, want, by)
    else:
        _compare(got.assign(_all=1), want.assign(_all=1), ["_all"])


def test_chance_default_is_clear_by_variant(store, raw):
    got = _compute(store, "chance_baseline", None)
    assert list(got.columns[:3]) == ["model", "prompt_style", "variant"]
    _compare(
        got,
        _chance_reference(raw, ["model", "prompt_style", "variant"], "clear"),
        ["model", "prompt_style", "variant"],
    )
    # the exact chance level of a k-distractor CLEAR item: 1/(k+1), or 1/(k+2) with a second abstain option
    by_variant = got.groupby("variant").chance_accuracy.first()
    assert by_variant["k1_gold"] == pytest.approx(1 / 2) and by_variant["k2_na_idk"] == pytest.approx(1 / 4)


def test_pairing_semantics(store, raw):
    """Hand-checkable consequences of the pairing rules, independent of the reference code above."""
    hd = _compute(store, "humility_deficit", ["run_id"]).set_index(["run_id", "k", "framing"])
    # the other-decoding run has no gold partner: every item unpaired, rates NULL
    row = hd.loc[("run04-k2_idk", 2, "IDK")]
    assert row.n_pairs == 0 and row.n_unpaired == 100 and np.isnan(row.accuracy)
    # a complete run: every abstention item paired exactly once even with two gold runs (tplA, tplB)
    assert hd.loc[("run00-k1_na", 1, "NA")].n_pairs == 100
    assert hd.loc[("run03-k1_na", 1, "NA")].n_pairs == 100
    # the self-evaluation run never appears
    assert not hd.reset_index().run_id.str.startswith("run05").any()
    # each side's rates partition the samples: target + distractor + unparsed = 1
    full = _compute(store, "humility_deficit", ["model"])
    total = full.abstention_rate + full.incorrect_selection_rate + full.unparsed_rate_abstain
    np.testing.assert_allclose(total, 1.0, atol=1e-12)
    sh = _compute(store, "idk_shift", ["model"])
    for side in ("before", "after"):
        cols = [f"p_{x}_{side}" for x in ("distractor", "na", "second", "unparsed")]
        np.testing.assert_allclose(sh[cols].sum(axis=1), 1.0, atol=1e-12)
    assert (sh.p_second_before == 0).all()  # the second option is not offered before
    # m2 dropped ~20% of items in every config; m1's other-decoding run is never paired
    assert (full.set_index("model").n_unpaired.groupby("model").sum() > 0).all()


def test_complete_run_equals_per_config_rates(store, raw):
    """With one run per side and no item missing, every item is paired, so the paired rates are the
    plain per-config means of per-item means (item-weighted, whatever the samples per item)."""
    d = _clear_rows(raw)
    d = d[(d.model == "m1") & (d.prompt_style == "cot")]
    item_acc = d.groupby(["variant", "item_id"]).correct.mean().groupby("variant").mean()
    got = _compute(store, "humility_deficit", ["model", "prompt_style"])
    got = got[(got.model == "m1") & (got.prompt_style == "cot")].set_index(["k", "framing"])
    for k in (1, 2):
        for fr in ("NA", "IDK", "INA"):
            row = got.loc[(k, fr)]
            assert row.n_pairs == 100 and row.n_unpaired == 0
            assert row.accuracy == pytest.approx(item_acc[f"k{k}_gold"], abs=1e-12)
            assert row.abstention_rate == pytest.approx(item_acc[f"k{k}_{fr.lower()}"], abs=1e-12)


def test_bad_params_are_refused(store):
    con = duckdb.connect(str(store), read_only=True)
    try:
        before = con.execute("SELECT count(*) FROM predictions").fetchone()[0]
        for bad in ["clear' OR '1'='1", "clear'; DROP TABLE runs; --", "", 3, None, ["clear"]]:
            with pytest.raises(ValueError, match="bad suite"):
                compute(con, "chance_baseline", ["model"], {"suite": bad})
        with pytest.raises(ValueError, match="unknown parameter"):
            compute(con, "chance_baseline", ["model"], {"suite": "clear", "suit": "x"})
        for name in ("humility_deficit", "idk_shift"):
            with pytest.raises(ValueError, match="unknown parameter"):
                compute(con, name, ["model"], {"k": "1); DROP TABLE runs; --"})
            with pytest.raises(KeyError, match="cannot group by"):
                compute(con, name, ["model", "raw_output; DROP TABLE runs"])
        with pytest.raises(KeyError, match="cannot group by"):
            compute(con, "chance_baseline", ["target_label"])
        # an unknown but well-formed suite is simply empty
        assert compute(con, "chance_baseline", ["model"], {"suite": "no-such-suite"}).empty
        assert con.execute("SELECT count(*) FROM predictions").fetchone()[0] == before
    finally:
        con.close()


@pytest.mark.parametrize("name", ["humility_deficit", "idk_shift", "chance_baseline"])
def test_clear_metrics_do_not_depend_on_threads(store, name):
    """The same bits with one DuckDB thread and with four and parallelism forced onto this small
    store (``PRAGMA verify_parallelism``): the rates over pairs are means of per-item ratios such as
    1/3, which a parallel ``avg`` would add in thread order."""
    one, forced = one_thread_and_forced_parallel(
        store, lambda con: compute(con, name, ["model", "prompt_style"])
    )
    assert len(one) > 0
    pd.testing.assert_frame_equal(forced, one, check_exact=True)
