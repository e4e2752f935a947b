"""Robustness metrics (flip analysis, McNemar, paired bootstrap, bootstrap CI) against independent
recomputations.

The references rebuild everything from the raw store tables in pandas: correctness from parsed and
target labels, the option softmax, the base/perturbed pairing on base_id within matching runs, the
flip categories and pool means, and the unpaired base samples. McNemar is checked against statsmodels
(exact binomial and chi-square with continuity correction); the bootstraps against a plain numpy
loop that follows the RNG stream the module documents (SHA-256 of the group key, ``default_rng([seed,
h])``, ``floor(u * n)``), drawn in one block. A tiny hand-built store pins a few values computed by
hand, so the references cannot share a misreading of the definitions with the module.
"""

from __future__ import annotations

import functools
import hashlib
import math
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

from equipoise.evaluators.metrics import compute
from equipoise.evaluators.metrics import robustness as rob
from equipoise.evaluators.store import connect, insert_table
from equipoise.evaluators.synthetic import SyntheticSpec, make_store
from tests.scores import edit_option_scores

TOL = 1e-9
BASE = "original"
CONFIGS = (("original", True), ("plus_nota", True), ("minus_correct_plus_nota", False))
CATEGORIES = ("stable_correct", "correct_to_wrong", "wrong_to_correct", "stable_wrong")
PAIR_KEYS = ["dataset_id", "model", "backend", "prompt_style", "decoding_json", "base_id"]
MCN_TOKEN = {"perturbed_variant": "minus_correct_plus_nota", "uncertainty": "token_mean"}
SAMPLE1 = {"sample_index": 1, "uncertainty": "option_prob"}
# (grouping, parameters) combinations: every grouping shape (none, one, several strata, strata with
# NULLs and mixed types, run_id) and every pairing option, without the full cross product (runtime)
COMBOS: tuple[tuple[tuple[str, ...], dict], ...] = (
    ((), {}),
    ((), MCN_TOKEN),
    (("model",), SAMPLE1),
    (("model", "prompt_style"), {}),
    (("specialty", "question_type"), {}),
    (("framing", "k", "imaging_modality"), MCN_TOKEN),
    (("difficulty", "config"), SAMPLE1),
    (("run_id",), {}),
)


def _ids(combo: tuple[tuple[str, ...], dict]) -> str:
    by, params = combo
    return ("+".join(by) or "all") + "-" + ("-".join(f"{k}={v}" for k, v in params.items()) or "default")


# ---------------------------------------------------------------------------------------------
# stores
# ---------------------------------------------------------------------------------------------
def _add_extras(con: duckdb.DuckDBPyConnection) -> None:
    """A second prompt style with different answers and scores, a self-evaluation run (would pair if
    it were not excluded) and a perturbed run under other decoding settings (must not pair)."""
    edit_option_scores(
        con,
        """
        INSERT INTO runs SELECT run_id || '-cot', model, backend, 'cot', prompt_template_id, prompt_sha256,
               decoding_json, dataset_id, config, package_version, NULL FROM runs;
        INSERT INTO predictions
        SELECT run_id || '-cot', item_id, sample_index, raw_output,
               CASE WHEN hash(run_id || item_id || sample_index) % 4 = 0
                        THEN chr((65 + hash(item_id || 'x' || sample_index) % 4)::INTEGER)
                    WHEN hash(run_id || item_id || sample_index) % 37 = 0 THEN 'Z'  -- off-list label
                    ELSE parsed_label END,
               parse_method, outcome, token_logprob_sum, token_logprob_mean * 1.3, token_logprob_min,
               n_output_tokens, latency_ms, error, NULL, NULL
        FROM predictions;
        INSERT INTO option_scores
        SELECT run_id || '-cot', item_id, sample_index, label,
               logprob + (hash(run_id || item_id || label) % 7) / 5.0
        FROM option_scores;
        """,
    )
    for suffix, where, style, decoding in (
        ("-se", "model = 'm1' AND prompt_style = 'base'", "'self_eval:conf'", "decoding_json"),
        ("-t07", "model = 'm2' AND prompt_style = 'base' AND config = 'plus_nota'", "prompt_style",
         "'{\"temperature\": 0.7}'"),
    ):  # fmt: skip
        edit_option_scores(
            con,
            f"""
            CREATE TEMP TABLE pick AS SELECT run_id FROM runs WHERE {where};
            INSERT INTO runs SELECT run_id || '{suffix}', model, backend, {style}, prompt_template_id,
                   prompt_sha256, {decoding}, dataset_id, config, package_version, NULL
            FROM runs WHERE run_id IN (SELECT run_id FROM pick);
            INSERT INTO predictions SELECT * REPLACE (run_id || '{suffix}' AS run_id)
            FROM predictions WHERE run_id IN (SELECT run_id FROM pick);
            INSERT INTO option_scores SELECT * REPLACE (run_id || '{suffix}' AS run_id)
            FROM option_scores WHERE run_id IN (SELECT run_id FROM pick);
            DROP TABLE pick;
            """,
        )


def _damage(con: duckdb.DuckDBPyConnection) -> None:
    """Unscored options (sometimes the chosen one), samples without any score or token log-probs,
    error rows, perturbed samples missing (unpaired bases), two perturbed items for some base_ids,
    and NULL or mixed strata."""
    edit_option_scores(
        con,
        """
        DELETE FROM option_scores WHERE hash(run_id || item_id || label) % 9 = 0;
        DELETE FROM option_scores WHERE hash(run_id || item_id || 's') % 23 = 0;
        UPDATE predictions SET token_logprob_mean = NULL WHERE hash(item_id || run_id || 't') % 17 = 0;
        UPDATE predictions SET parsed_label = NULL, outcome = 'error', error = 'timeout'
        WHERE hash(item_id || run_id || 'e') % 19 = 0;
        DELETE FROM predictions
        WHERE item_id NOT LIKE '%:original' AND hash(item_id || run_id || 'd') % 13 = 0;
        UPDATE items SET difficulty = CASE hash(base_id) % 3 WHEN 0 THEN 'easy' WHEN 1 THEN 'hard' END;
        UPDATE items SET k = NULL WHERE hash(base_id) % 7 = 0;
        CREATE TEMP TABLE dup AS
            SELECT item_id FROM items WHERE config = 'plus_nota' AND hash(base_id || 'dup') % 5 = 0;
        INSERT INTO items SELECT * REPLACE (item_id || ':dup' AS item_id)
            FROM items WHERE item_id IN (SELECT item_id FROM dup);
        INSERT INTO options SELECT * REPLACE (item_id || ':dup' AS item_id)
            FROM options WHERE item_id IN (SELECT item_id FROM dup);
        INSERT INTO predictions
            SELECT * REPLACE (item_id || ':dup' AS item_id,
                              chr((65 + hash(item_id || run_id || 'dup') % 4)::INTEGER) AS parsed_label,
                              token_logprob_mean - 0.25 AS token_logprob_mean)
            FROM predictions WHERE item_id IN (SELECT item_id FROM dup);
        INSERT INTO option_scores SELECT * REPLACE (item_id || ':dup' AS item_id, logprob * 0.5 AS logprob)
            FROM option_scores WHERE item_id IN (SELECT item_id FROM dup);
        DROP TABLE dup;
        """,
    )


@pytest.fixture(scope="module", params=["plain", "damaged"])
def store(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp(f"rob_{request.param}") / "s.duckdb"
    seed = 3 if request.param == "plain" else 11
    make_store(
        path,
        SyntheticSpec(
            n_items=90, models=("m1", "m2", "m3"), configs=CONFIGS, samples=2, unparsed_rate=0.08, seed=seed
        ),
    )
    con = duckdb.connect(str(path))
    _add_extras(con)
    if request.param == "damaged":
        _damage(con)
    con.close()
    return path


def _compute(path: Path, name: str, by: Sequence[str] | None, params: dict | None = None) -> pd.DataFrame:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return compute(con, name, None if by is None else list(by), params)
    finally:
        con.close()


# ---------------------------------------------------------------------------------------------
# independent reference
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _tables(path: Path) -> dict[str, pd.DataFrame]:
    con = duckdb.connect(str(path), read_only=True)
    names = ("predictions", "runs", "items", "options", "option_scores")
    out = {t: con.execute(f"SELECT * FROM {t}").df() for t in names}
    con.close()
    return out


@functools.lru_cache(maxsize=16)
def _samples(path: Path, uncertainty: str) -> pd.DataFrame:
    """Every prediction sample with strata, correctness, the unparsed flag and its uncertainty."""
    t = _tables(path)
    p = (
        t["predictions"]
        .merge(t["runs"], on="run_id")
        .merge(t["items"], on=["dataset_id", "config", "item_id"])
    )
    labels = t["options"][["dataset_id", "config", "item_id", "label"]]
    on_list = p.merge(labels, left_on=["dataset_id", "config", "item_id", "parsed_label"],
                      right_on=["dataset_id", "config", "item_id", "label"])  # fmt: skip
    key = ["run_id", "item_id", "sample_index"]
    p["unparsed"] = ~p.set_index(key).index.isin(on_list.set_index(key).index)
    p["correct"] = [bool(pd.notna(a) and a == b) for a, b in zip(p.parsed_label, p.target_label, strict=True)]
    if uncertainty == "option_prob":
        sc = t["option_scores"].merge(t["runs"][["run_id", "dataset_id", "config"]], on="run_id")
        sc = sc.merge(labels, on=["dataset_id", "config", "item_id", "label"])
        e = np.exp(sc.logprob - sc.groupby(key).logprob.transform("max"))
        sc["prob"] = e / e.groupby([sc[k] for k in key]).transform("sum")
        chosen = sc[[*key, "label", "prob"]].rename(columns={"label": "parsed_label"})
        p = p.merge(chosen, on=[*key, "parsed_label"], how="left")
        p["u"] = 1 - p["prob"]
    else:
        p["u"] = -p.token_logprob_mean
    return p


def _pairs(path: Path, params: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, unpaired base samples), base-side strata."""
    p = _samples(path, params.get("uncertainty", "option_prob"))
    s = p[(p.sample_index == params.get("sample_index", 0)) & ~p.prompt_style.str.startswith("self_eval:")]
    b = s[s.variant == BASE]
    q = s[s.variant == params.get("perturbed_variant", "plus_nota")]
    pairs = b.merge(q, on=PAIR_KEYS, suffixes=("", "_q"))
    hit = b.merge(q[PAIR_KEYS].drop_duplicates(), on=PAIR_KEYS, how="left", indicator=True)
    return pairs, b[(hit["_merge"] == "left_only").to_numpy()]


def _norm(v: object) -> str:
    """A key value as the module's documented RNG stream writes it."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def _key(values: Sequence[object]) -> tuple[str, ...]:
    return tuple(_norm(v) for v in values)


def _groups(df: pd.DataFrame, by: Sequence[str]) -> Iterator[tuple[tuple[str, ...], pd.DataFrame]]:
    if not by:
        yield (), df
        return
    for k, g in df.groupby(list(by), dropna=False, sort=False):
        yield _key(k if isinstance(k, tuple) else (k,)), g


def _rows(df: pd.DataFrame, by: Sequence[str]) -> dict[tuple[str, ...], pd.DataFrame]:
    """Result rows per normalised group key."""
    keys = [_key(r) for r in df[list(by)].itertuples(index=False)] if by else [()] * len(df)
    out: dict[tuple[str, ...], list[int]] = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return {k: df.iloc[ix].reset_index(drop=True) for k, ix in out.items()}


def _rng(seed: int, key: tuple[str, ...]) -> np.random.Generator:
    h = int.from_bytes(hashlib.sha256("\x1f".join(key).encode()).digest()[:8], "little")
    return np.random.default_rng([seed, h])


def _reps_mean(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Replicate means, all replicates drawn in one block (the module draws in blocks)."""
    idx = np.floor(rng.random((n_boot, len(d))) * len(d)).astype(np.int64)
    return d[idx].sum(axis=1) / len(d)


def _close(a: object, b: object, tol: float = TOL) -> bool:
    fa, fb = float(a), float(b)  # type: ignore[arg-type]
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    return abs(fa - fb) <= tol * max(1.0, abs(fb))


def _mean(x: pd.Series) -> float:
    x = x.dropna()
    return float(x.mean()) if len(x) else math.nan


# ---------------------------------------------------------------------------------------------
# flip analysis
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_flip_analysis_matches_pandas(store: Path, combo: tuple[tuple[str, ...], dict]) -> None:
    by, params = combo
    got = _compute(store, "flip_analysis", by, params)
    pairs, _ = _pairs(store, params)
    assert len(pairs) > 0
    rows = _rows(got, by)
    ref_groups = dict(_groups(pairs, by))
    assert set(rows) == set(ref_groups)
    for key, g in ref_groups.items():
        r = rows[key]
        assert list(r.category) == list(CATEGORIES)
        bc, pc = g.correct.to_numpy(), g.correct_q.to_numpy()
        masks = {
            "stable_correct": bc & pc,
            "correct_to_wrong": bc & ~pc,
            "wrong_to_correct": ~bc & pc,
            "stable_wrong": ~bc & ~pc,
        }
        for i, cat in enumerate(CATEGORIES):
            pool = bc if i < 2 else ~bc
            mean, pool_mean = _mean(g.u[masks[cat]]), _mean(g.u[pool])
            rel = (mean - pool_mean) / pool_mean if pool_mean not in (0.0,) else math.nan
            row = r.iloc[i]
            assert row.n_pairs == len(g)
            assert row.n == masks[cat].sum()
            assert row.pool == ("initially_correct" if i < 2 else "initially_wrong")
            assert row.n_pool == pool.sum()
            assert row.n_with_uncertainty == g.u[masks[cat]].notna().sum()
            assert _close(row["share"], masks[cat].sum() / len(g))
            assert _close(row.mean_uncertainty, mean)
            assert _close(row.pool_mean_uncertainty, pool_mean)
            assert _close(row.relative_uncertainty, rel)
        assert r.n.sum() == len(g)


def test_flip_analysis_exercises_the_interesting_cases(store: Path) -> None:
    """Guard against a vacuous comparison: the stores hold every category, unparsed pairs, missing
    uncertainty (damaged store) and pairs from duplicated perturbed items (damaged store)."""
    pairs, unpaired = _pairs(store, {})
    cats = set(zip(pairs.correct, pairs.correct_q, strict=True))
    assert cats == {(True, True), (True, False), (False, True), (False, False)}
    assert pairs.unparsed.any() and pairs.unparsed_q.any()
    assert pairs.u.isna().any()  # unparsed samples have no chosen-option probability
    assert pairs.correct_q.sum() > 0
    if "damaged" in store.parent.name:
        assert pairs.duplicated(["run_id", "item_id"]).any()
        assert len(unpaired) > 0


def test_the_variant_range_is_left_out_under_another_collation(store: Path) -> None:
    """rob_pairs' range on the two variant names orders them by code point, which only DuckDB's
    default binary collation shares ('Zed' < 'abc' there, not under NOCASE): on a connection with
    another default_collation the range is left out, and flip_analysis is the same."""
    con = duckdb.connect()
    assert rob._variant_range(con, "abc", "Zed") == "AND sc.variant BETWEEN 'Zed' AND 'abc'"
    assert con.execute("SELECT 'abc' BETWEEN 'Zed' AND 'abc'").fetchone() == (True,)
    con.execute("SET default_collation = 'nocase'")
    assert con.execute("SELECT 'abc' BETWEEN 'Zed' AND 'abc'").fetchone() == (False,)  # why
    assert rob._variant_range(con, "abc", "Zed") == ""
    plain = compute(connect(store, read_only=True), "flip_analysis")
    nocase = connect(store, read_only=True)
    nocase.execute("SET default_collation = 'nocase'")
    pd.testing.assert_frame_equal(compute(nocase, "flip_analysis"), plain)


# ---------------------------------------------------------------------------------------------
# McNemar
# ---------------------------------------------------------------------------------------------
def _sm(b: int, c: int, exact: bool) -> tuple[float, float]:
    res = sm_mcnemar(np.array([[10, b], [c, 7]]), exact=exact, correction=True)
    return float(res.statistic), float(res.pvalue)


@pytest.mark.parametrize("b", range(0, 41, 3))
def test_mcnemar_test_matches_statsmodels(b: int) -> None:
    for c in range(0, 41):
        method, stat, p = rob.mcnemar_test(b, c)
        assert method == ("exact" if b + c < 25 else "chi2")
        sm_stat, sm_p = _sm(b, c, exact=method == "exact")
        assert _close(stat, sm_stat, 1e-12) and _close(p, sm_p, 1e-12), (b, c)
        # forcing either branch still agrees with statsmodels' matching test
        if b + c > 0:
            _, stat1, p1 = rob.mcnemar_test(b, c, exact_below=1)
            assert (stat1, p1) == pytest.approx(_sm(b, c, exact=False), rel=1e-12, abs=1e-15)
        _, stat2, p2 = rob.mcnemar_test(b, c, exact_below=10**6)
        assert (stat2, p2) == pytest.approx(_sm(b, c, exact=True), rel=1e-12, abs=1e-15)


def test_mcnemar_test_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="exact_below"):
        rob.mcnemar_test(0, 0, exact_below=0)
    with pytest.raises(ValueError):
        rob.mcnemar_test(-1, 3)


@pytest.mark.parametrize(
    "combo",
    [
        *COMBOS,
        (("specialty", "question_type"), {"exact_below": 1, "alpha": 0.2}),
        ((), {"exact_below": 10**6}),
    ],
    ids=_ids,
)
def test_mcnemar_matches_statsmodels(store: Path, combo: tuple[tuple[str, ...], dict]) -> None:
    by, params = combo
    got = _compute(store, "mcnemar", by, params)
    pairs, unpaired = _pairs(store, params)
    exact_below, alpha = params.get("exact_below", 25), params.get("alpha", 0.05)
    rows = _rows(got, by)
    ref_pairs, ref_unpaired = dict(_groups(pairs, by)), dict(_groups(unpaired, by))
    assert set(rows) == set(ref_pairs) | set(ref_unpaired)
    empty = pairs.iloc[:0]
    methods = set()
    for key, r in rows.items():
        assert len(r) == 1
        row = r.iloc[0]
        g = ref_pairs.get(key, empty)
        bc, pc = g.correct.to_numpy(bool), g.correct_q.to_numpy(bool)
        b, c = int((bc & ~pc).sum()), int((~bc & pc).sum())
        assert row.n_pairs == len(g)
        assert (row.n_stable_correct, row.n_correct_to_wrong) == ((bc & pc).sum(), b)
        assert (row.n_wrong_to_correct, row.n_stable_wrong) == (c, (~bc & ~pc).sum())
        assert row.n_discordant == b + c
        assert row.n_unparsed_base == g.unparsed.sum() and row.n_unparsed_perturbed == g.unparsed_q.sum()
        assert row.n_base_unpaired == len(ref_unpaired.get(key, empty))
        acc_b = bc.mean() if len(g) else math.nan
        acc_p = pc.mean() if len(g) else math.nan
        assert _close(row.accuracy_base, acc_b) and _close(row.accuracy_perturbed, acc_p)
        assert _close(row.accuracy_change, acc_p - acc_b)
        exact = b + c < exact_below
        assert row.method == ("exact" if exact else "chi2")
        if b + c > 0:  # an empty discordant table is always "exact" (p = 1)
            methods.add(row.method)
        stat, p = _sm(b, c, exact)
        assert _close(row.statistic, stat) and _close(row.p_value, p)
        assert bool(row.significant) == (p <= alpha)
    if params.get("exact_below") == 1:
        assert methods == {"chi2"}
    if not by and not params:
        assert methods == {"chi2"}  # the pooled table is large enough for the asymptotic test
    if by == ("specialty", "question_type") and not params:
        assert "exact" in methods


def test_mcnemar_counts_unpaired_bases(store: Path) -> None:
    got = _compute(store, "mcnemar", [])
    _, unpaired = _pairs(store, {})
    assert int(got.n_base_unpaired.iloc[0]) == len(unpaired)
    if "damaged" in store.parent.name:
        assert len(unpaired) > 0


# ---------------------------------------------------------------------------------------------
# paired bootstrap of the uncertainty change
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "combo", [*COMBOS, (("model", "prompt_style"), {"seed": 12345, "alpha": 0.1, "n_boot": 500})], ids=_ids
)
def test_paired_bootstrap_matches_numpy(store: Path, combo: tuple[tuple[str, ...], dict]) -> None:
    by, params = combo
    got = _compute(store, "paired_bootstrap_uncertainty", by, params)
    pairs, _ = _pairs(store, params)
    seed, alpha, n_boot = params.get("seed", 0), params.get("alpha", 0.05), params.get("n_boot", 2000)
    rows = _rows(got, by)
    ref = dict(_groups(pairs, by))
    assert set(rows) == set(ref)
    for key, g in ref.items():
        row = rows[key].iloc[0]
        g = g.sort_values(["run_id", "item_id", "run_id_q", "item_id_q"])
        ok = g.u.notna() & g.u_q.notna()
        d = (g.u_q - g.u)[ok].to_numpy()
        assert row.n_pairs == len(g) and row.n_missing == (~ok).sum() and row.n_used == len(d)
        assert (row.n_boot, row.seed, row.alpha) == (n_boot, seed, alpha)
        if len(d) == 0:
            assert math.isnan(row.mean_diff) and math.isnan(row.ci_low) and math.isnan(row.p_value)
            continue
        reps = _reps_mean(d, n_boot, _rng(seed, key))
        lo, hi = np.percentile(reps, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        p = min(1.0, 2 * min((reps <= 0).mean(), (reps >= 0).mean()))
        assert _close(row.mean_diff, d.mean())
        assert _close(row.ci_low, lo) and _close(row.ci_high, hi)
        assert _close(row.p_value, p)
        assert bool(row.significant) == (row.p_value <= alpha)


def test_paired_bootstrap_is_deterministic_and_seeded(store: Path, monkeypatch) -> None:
    by = ["model", "prompt_style"]
    a = _compute(store, "paired_bootstrap_uncertainty", by, {"n_boot": 300})
    b = _compute(store, "paired_bootstrap_uncertainty", by, {"n_boot": 300})
    pd.testing.assert_frame_equal(a, b)
    c = _compute(store, "paired_bootstrap_uncertainty", by, {"n_boot": 300, "seed": 1})
    assert not np.allclose(a.ci_low, c.ci_low)
    pd.testing.assert_series_equal(a.mean_diff, c.mean_diff)  # the point estimate does not resample
    # the stream does not depend on the block size used to bound memory
    monkeypatch.setattr(rob, "_BLOCK_CELLS", 7)
    d = _compute(store, "paired_bootstrap_uncertainty", by, {"n_boot": 300})
    pd.testing.assert_frame_equal(a, d)
    # a group's interval does not depend on the other groups: restrict the store to one model
    one = _compute(store, "paired_bootstrap_uncertainty", ["model"], {"n_boot": 300})
    path = store.parent / "one_model.duckdb"
    shutil.copy(store, path)
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM runs WHERE model <> 'm2'")
    con.close()
    only = _compute(path, "paired_bootstrap_uncertainty", ["model"], {"n_boot": 300})
    path.unlink()
    pd.testing.assert_frame_equal(only, one[one.model == "m2"].reset_index(drop=True))


@pytest.mark.parametrize(("n", "n_boot", "parts"), [(1, 5, 3), (7, 300, 4), (1000, 301, 3), (40000, 9, 2)])
def test_bootstrap_parts_draw_the_sequential_stream(n: int, n_boot: int, parts: int, monkeypatch) -> None:
    """Split into parts (each a generator jumped ahead to its first replicate), run in reverse
    order, the replicate means are bit-for-bit those of one sequential draw of the whole stream."""
    x = np.random.default_rng(n).normal(size=n)
    want = np.floor(np.random.default_rng([3, n]).random((n_boot, n)) * n).astype(np.int64)
    want_means = x[want].mean(axis=1)
    monkeypatch.setattr(rob, "_SPLIT_CELLS", 1)
    monkeypatch.setattr(rob, "_BLOCK_CELLS", 50)
    split = rob.bootstrap_means_parts(x, n_boot, np.random.default_rng([3, n]), parts)
    assert len(split) == min(parts, n_boot)
    for task, _ in reversed(split):
        task()
    got = np.concatenate([view for _, view in split])
    assert np.array_equal(got, want_means)
    assert np.array_equal(rob.bootstrap_means(x, n_boot, np.random.default_rng([3, n])), want_means)


def test_paired_bootstrap_split_matches_unsplit(store: Path, monkeypatch) -> None:
    by = ["model", "prompt_style"]
    a = _compute(store, "paired_bootstrap_uncertainty", by, {"n_boot": 300})
    monkeypatch.setattr(rob, "_SPLIT_CELLS", 1)
    b = _compute(store, "paired_bootstrap_uncertainty", by, {"n_boot": 300})
    pd.testing.assert_frame_equal(a, b)


# ---------------------------------------------------------------------------------------------
# bootstrap CI for accuracy
# ---------------------------------------------------------------------------------------------
OTHER = {"seed": 9, "alpha": 0.2, "n_boot": 400}


@pytest.mark.parametrize(
    "combo",
    [((), {}), (("model",), OTHER), (("specialty", "question_type"), {}),
     (("framing", "k", "imaging_modality"), OTHER), (("run_id",), {})],
    ids=_ids,
)  # fmt: skip
def test_bootstrap_ci_matches_numpy(store: Path, combo: tuple[tuple[str, ...], dict]) -> None:
    by, params = combo
    got = _compute(store, "bootstrap_ci", by, params)
    s = _samples(store, "token_mean")
    s = s[~s.prompt_style.str.startswith("self_eval:")]
    seed, alpha, n_boot = params.get("seed", 0), params.get("alpha", 0.05), params.get("n_boot", 2000)
    rows = _rows(got, by)
    ref = dict(_groups(s, by))
    assert set(rows) == set(ref)
    for key, g in ref.items():
        row = rows[key].iloc[0]
        per_item = g.groupby(["run_id", "item_id"]).correct.agg(["sum", "count"]).sort_index()
        c, m = per_item["sum"].to_numpy(float), per_item["count"].to_numpy(float)
        assert row.n == len(g) and row.n_items == len(per_item)
        assert _close(row.accuracy, g.correct.mean())
        # the documented stream: multinomial counts over the distinct (m, c) kinds sorted by (m, c)
        kinds = pd.DataFrame({"m": m, "c": c}).value_counts().sort_index()
        km = kinds.index.get_level_values("m").to_numpy(float)
        kc = kinds.index.get_level_values("c").to_numpy(float)
        counts = _rng(seed, key).multinomial(len(c), kinds.to_numpy() / len(c), size=n_boot)
        reps = (counts * kc).sum(axis=1) / (counts * km).sum(axis=1)
        lo, hi = np.percentile(reps, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        assert _close(row.ci_low, lo) and _close(row.ci_high, hi)
        assert row.ci_low <= row.accuracy <= row.ci_high
        assert (row.n_boot, row.seed, row.alpha) == (n_boot, seed, alpha)


def test_multinomial_bootstrap_matches_index_resampling() -> None:
    """Counts over item kinds are the same bootstrap as resampling item indices: with many
    replicates both give the same replicate distribution (checked on its mean, sd and the 2.5 /
    97.5 percentiles) for a vector with a handful of kinds."""
    gen = np.random.default_rng(5)
    m = gen.integers(1, 4, size=400).astype(float)
    c = np.minimum(m, gen.integers(0, 3, size=400)).astype(float)
    n_boot = 40_000
    idx = np.floor(np.random.default_rng(1).random((n_boot, len(c))) * len(c)).astype(np.int64)
    direct = c[idx].sum(axis=1) / m[idx].sum(axis=1)
    kinds = pd.DataFrame({"m": m, "c": c}).value_counts().sort_index()
    counted = rob.multinomial_bootstrap_ratio(
        kinds.index.get_level_values("c").to_numpy(float),
        kinds.index.get_level_values("m").to_numpy(float),
        kinds.to_numpy(),
        n_boot,
        np.random.default_rng(2),
    )
    sd = direct.std()
    assert abs(counted.mean() - direct.mean()) < 0.02 * sd
    assert abs(counted.std() - sd) < 0.02 * sd
    for q in (2.5, 97.5):
        assert abs(np.percentile(counted, q) - np.percentile(direct, q)) < 0.05 * sd


# ---------------------------------------------------------------------------------------------
# a tiny store with values worked out by hand
# ---------------------------------------------------------------------------------------------
def _tiny(path: Path) -> Path:
    """Six base items (target A) and their +nota versions (option E = NOTA, target still A).
    base:      b1 A, b2 A, b3 A, b4 B, b5 (unparsed), b6 C     token means -.2 -.4 -.6 -1 -2 -3
    perturbed: b1 A, b2 E, b3 B, b4 A, b5 C, b6 (unparsed)     token means -.3 -.4 -1 -1.5 -2 -2.5
    Option scores only for base b1 (p(A) = .7) and b4 (p(B) = .5). A second model 'same' answers the
    perturbed items exactly as model 'm' answered the base items: no flips, no uncertainty change."""
    con = connect(path)
    ds = "tiny"
    ids = [f"b{i}" for i in range(1, 7)]
    rows: dict[str, list[dict]] = {k: [] for k in ("datasets", "items", "options", "runs")}
    preds, scores = [], []
    spec = {
        "original": (["A", "A", "A", "B", None, "C"], [-0.2, -0.4, -0.6, -1.0, -2.0, -3.0], "ABCD"),
        "plus_nota": (["A", "E", "B", "A", "C", None], [-0.3, -0.4, -1.0, -1.5, -2.0, -2.5], "ABCDE"),
    }
    for cfg, (parsed, tm, letters) in spec.items():
        rows["datasets"].append(
            {"dataset_id": ds, "config": cfg, "suite": "nota", "name": "t", "location": "m",
             "builder_version": "0", "seed": 0}
        )  # fmt: skip
        run = f"run-{cfg}"
        rows["runs"].append(
            {"run_id": run, "model": "m", "backend": "b", "prompt_style": "base", "prompt_template_id": "t",
             "prompt_sha256": "0", "decoding_json": "{}", "dataset_id": ds, "config": cfg,
             "package_version": "0"}
        )  # fmt: skip
        for i, base in enumerate(ids):
            iid = f"{base}:{cfg}"
            rows["items"].append(
                {"dataset_id": ds, "config": cfg, "item_id": iid, "base_id": base, "task": "mcq",
                 "suite": "nota", "variant": cfg, "target_label": "A", "target_role": "gold",
                 "has_gold": True, "abstain_expected": False, "n_options": len(letters)}
            )  # fmt: skip
            for L in letters:
                role = "gold" if L == "A" else ("nota" if L == "E" else "distractor")
                rows["options"].append(
                    {
                        "dataset_id": ds,
                        "config": cfg,
                        "item_id": iid,
                        "label": L,
                        "option_id": L,
                        "role": role,
                    }
                )
            preds.append(
                {"run_id": run, "item_id": iid, "sample_index": 0, "raw_output": "x",
                 "parsed_label": parsed[i], "parse_method": "t" if parsed[i] else "unparsed",
                 "outcome": "answered" if parsed[i] else "unparsed", "token_logprob_mean": tm[i]}
            )  # fmt: skip
    for item, probs in (("b1:original", [0.7, 0.1, 0.1, 0.1]), ("b4:original", [0.25, 0.5, 0.125, 0.125])):
        for L, pr in zip("ABCD", probs, strict=True):
            scores.append(
                {"run_id": "run-original", "item_id": item, "sample_index": 0, "label": L,
                 "logprob": math.log(pr)}
            )  # fmt: skip
    for name, r in rows.items():
        insert_table(con, name, pa.Table.from_pylist(r))
    schema = pa.schema(
        [("run_id", pa.string()), ("item_id", pa.string()), ("sample_index", pa.int32()),
         ("raw_output", pa.string()), ("parsed_label", pa.string()), ("parse_method", pa.string()),
         ("outcome", pa.string()), ("token_logprob_mean", pa.float64())]
    )  # fmt: skip
    insert_table(con, "predictions", pa.Table.from_pylist(preds, schema=schema))
    insert_table(con, "option_scores", pa.Table.from_pylist(scores))
    con.execute(
        """
        INSERT INTO runs SELECT * REPLACE ('same-' || run_id AS run_id, 'same' AS model) FROM runs;
        INSERT INTO predictions SELECT * REPLACE ('same-run-original' AS run_id, NULL AS score_labels,
                                                  NULL AS score_logprobs)
            FROM predictions WHERE run_id = 'run-original';
        INSERT INTO predictions SELECT * REPLACE ('same-run-plus_nota' AS run_id,
                                                  replace(item_id, ':original', ':plus_nota') AS item_id,
                                                  NULL AS score_labels, NULL AS score_logprobs)
            FROM predictions WHERE run_id = 'run-original';
        """
    )
    con.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory.mktemp("tiny") / "t.duckdb")


def _one(path: Path, name: str, params: dict | None = None, model: str = "m") -> pd.DataFrame:
    """One model's rows of a metric grouped by model."""
    df = _compute(path, name, ["model"], params)
    return df[df.model == model].reset_index(drop=True)


def test_tiny_flip_by_hand(tiny: Path) -> None:
    got = _one(tiny, "flip_analysis", {"uncertainty": "token_mean"}).set_index("category")
    assert list(got.n) == [1, 2, 1, 2]
    assert list(got.n_pool) == [3, 3, 3, 3]
    assert got["share"].tolist() == pytest.approx([1 / 6, 2 / 6, 1 / 6, 2 / 6], abs=1e-15)
    assert got.mean_uncertainty.tolist() == pytest.approx([0.2, 0.5, 1.0, 2.5], abs=1e-12)
    assert got.pool_mean_uncertainty.tolist() == pytest.approx([0.4, 0.4, 2.0, 2.0], abs=1e-12)
    assert got.relative_uncertainty.tolist() == pytest.approx([-0.5, 0.25, -0.5, 0.25], abs=1e-12)
    # option-probability uncertainty: only b1 (1 - .7) and b4 (1 - .5) have one
    op = _one(tiny, "flip_analysis", {}).set_index("category")
    assert list(op.n_with_uncertainty) == [1, 0, 1, 0]
    assert op.mean_uncertainty.iloc[[0, 2]].tolist() == pytest.approx([0.3, 0.5], abs=1e-12)
    assert op.relative_uncertainty.iloc[[0, 2]].tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    assert op.relative_uncertainty.iloc[[1, 3]].isna().all()


def test_tiny_mcnemar_and_bootstraps_by_hand(tiny: Path) -> None:
    m = _one(tiny, "mcnemar").iloc[0]
    assert (m.n_pairs, m.n_correct_to_wrong, m.n_wrong_to_correct, m.n_base_unpaired) == (6, 2, 1, 0)
    assert (m.n_unparsed_base, m.n_unparsed_perturbed) == (1, 1)
    assert m.accuracy_change == pytest.approx(-1 / 6, abs=1e-15)
    # exact: 2 * P(X <= 1), X ~ Bin(3, 1/2) = 2 * 4/8, capped at 1
    assert (m.method, m.statistic, m.p_value, bool(m.significant)) == ("exact", 1.0, 1.0, False)
    pb = _one(tiny, "paired_bootstrap_uncertainty", {"uncertainty": "token_mean"}).iloc[0]
    assert (pb.n_pairs, pb.n_missing, pb.n_used) == (6, 0, 6)
    assert pb.mean_diff == pytest.approx(0.5 / 6, abs=1e-12)  # diffs .1 0 .4 .5 0 -.5
    assert -0.5 <= pb.ci_low < pb.mean_diff < pb.ci_high <= 0.5
    pb2 = _one(tiny, "paired_bootstrap_uncertainty").iloc[0]
    assert (pb2.n_pairs, pb2.n_missing, pb2.n_used) == (6, 6, 0)  # no perturbed option scores
    assert math.isnan(pb2.mean_diff) and pd.isna(pb2.significant)
    ci = _one(tiny, "bootstrap_ci").iloc[0]
    assert (ci.n, ci.n_items) == (12, 12) and ci.accuracy == pytest.approx(5 / 12, abs=1e-15)


def test_tiny_no_change_is_not_significant(tiny: Path) -> None:
    """Identical answers and uncertainties before and after: no flips, McNemar p = 1, every bootstrap
    replicate of the uncertainty change is exactly 0, so the interval is [0, 0] and p = 1."""
    flip = _one(tiny, "flip_analysis", {"uncertainty": "token_mean"}, model="same")
    assert list(flip.n) == [3, 0, 0, 3]
    m = _one(tiny, "mcnemar", model="same").iloc[0]
    assert (m.n_discordant, m.method, m.p_value, m.accuracy_change) == (0, "exact", 1.0, 0.0)
    pb = _one(tiny, "paired_bootstrap_uncertainty", {"uncertainty": "token_mean"}, model="same").iloc[0]
    assert (pb.n_used, pb.mean_diff, pb.ci_low, pb.ci_high, pb.p_value) == (6, 0.0, 0.0, 0.0, 1.0)
    assert not pb.significant


def test_empty_store_gives_empty_or_null_rows(tmp_path: Path) -> None:
    path = tmp_path / "e.duckdb"
    connect(path).close()
    for name in ("flip_analysis", "mcnemar", "paired_bootstrap_uncertainty", "bootstrap_ci"):
        assert len(_compute(path, name, None)) == 0
    flip = _compute(path, "flip_analysis", [])
    assert list(flip.category) == list(CATEGORIES) and (flip.n == 0).all()
    assert _compute(path, "mcnemar", []).p_value.iloc[0] == 1.0
    assert _compute(path, "paired_bootstrap_uncertainty", []).n_used.iloc[0] == 0
    ci = _compute(path, "bootstrap_ci", []).iloc[0]
    assert ci.n == 0 and math.isnan(ci.ci_low)


# ---------------------------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------------------------
BAD = [
    ("flip_analysis", {"base_variant": "original' OR 1=1 --"}, "base_variant"),
    ("flip_analysis", {"perturbed_variant": "x'); DROP TABLE predictions; --"}, "perturbed_variant"),
    ("flip_analysis", {"base_variant": None}, "base_variant"),
    ("flip_analysis", {"perturbed_variant": "original"}, "both"),
    ("flip_analysis", {"n_boots": 10}, "unknown parameter"),
    ("mcnemar", {"uncertainty": "1; DROP TABLE runs"}, "uncertainty"),
    ("mcnemar", {"sample_index": "0; DROP TABLE runs"}, "sample_index"),
    ("mcnemar", {"sample_index": -1}, "sample_index"),
    ("mcnemar", {"sample_index": 0.5}, "sample_index"),
    ("mcnemar", {"alpha": 0}, "alpha"),
    ("mcnemar", {"alpha": 1.0}, "alpha"),
    ("mcnemar", {"alpha": "abc"}, "alpha"),
    ("mcnemar", {"alpha": float("nan")}, "alpha"),
    ("mcnemar", {"exact_below": 0}, "exact_below"),
    ("paired_bootstrap_uncertainty", {"n_boot": 0}, "n_boot"),
    ("paired_bootstrap_uncertainty", {"n_boot": 2.5}, "n_boot"),
    ("paired_bootstrap_uncertainty", {"n_boot": True}, "n_boot"),
    ("paired_bootstrap_uncertainty", {"seed": -1}, "seed"),
    ("paired_bootstrap_uncertainty", {"seed": "1; DROP TABLE runs"}, "seed"),
    ("bootstrap_ci", {"sample_index": 0}, "unknown parameter"),
    ("bootstrap_ci", {"alpha": -0.1}, "alpha"),
]


def test_bad_parameters_are_clear_errors_and_inject_nothing(tiny: Path, tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    shutil.copy(tiny, path)
    con = duckdb.connect(str(path))  # writable: an injected statement could really run
    count = "SELECT (SELECT count(*) FROM predictions) + (SELECT count(*) FROM runs)"
    before = con.execute(count).fetchone()
    try:
        for name, params, match in BAD:
            with pytest.raises(ValueError, match=match):
                compute(con, name, [], params)
        for by in (["model; DROP TABLE runs"], ["model", "1=1 --"], ["base_id"]):
            with pytest.raises(KeyError, match="cannot group by"):
                compute(con, "mcnemar", by)
        assert con.execute(count).fetchone() == before
    finally:
        con.close()


def test_string_parameters_as_a_command_line_gives_them(tiny: Path) -> None:
    as_text = {"n_boot": "50", "seed": "3", "alpha": "0.1", "sample_index": "0", "uncertainty": "token_mean"}
    as_num = {"n_boot": 50, "seed": 3, "alpha": 0.1, "sample_index": 0, "uncertainty": "token_mean"}
    a = _compute(tiny, "paired_bootstrap_uncertainty", ["model"], as_text)
    b = _compute(tiny, "paired_bootstrap_uncertainty", ["model"], as_num)
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize(
    "n", [1, 2, 3, 5, 7, 1000, 16_017, 2**20, 2**20 + 1, 2**31 - 1, 2**40 + 3, 2**52 + 9]
)
def test_largest_uniform_indexes_below_n(n: int) -> None:
    """_fill_means gathers with np.take(mode="clip"), which would hide an index n instead of
    raising: the largest double rng.random returns, 1 - 2^-53, times n must truncate below n."""
    u = np.nextafter(1.0, 0.0)
    assert u == 1 - 2.0**-53
    assert int(np.float64(u) * n) == n - 1
