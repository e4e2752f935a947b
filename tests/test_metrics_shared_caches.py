"""The per-connection caches of the calibration and robustness metrics give the numbers of the views.

On a connection with fixed base relations (``prepare(con, materialize=True)``, what ``equipoise
metrics`` and ``report`` use) ``cal_samples`` and its tie blocks (calibration.py) and the robustness
pairs (robustness.py) are computed once into TEMP tables keyed by their parameters and grouping. A
key that missed a parameter, or a narrow table that missed a column some grouping needs, would
serve another query's rows; so every metric is compared with the plain views under several
groupings and parameters, after the cache was filled by a different grouping and parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb
import pandas as pd
import pytest

from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.evaluators.metrics.registry import REGISTRY, _load_all, compute, prepare
from equipoise.evaluators.reference_run import run_reference_policies
from equipoise.evaluators.store import connect

CAL = ("auroc", "aurc", "prr", "ece", "reliability", "brier", "brier_multiclass", "risk_coverage")
ROB = ("flip_analysis", "mcnemar", "paired_bootstrap_uncertainty")
BYS = ([], ["run_id"], ["variant", "k"], ["model", "condition"], ["k", "model"])
CAL_PARAMS = (
    {},
    {"confidence": "target_prob", "samples": "first", "n_bins": 7},
    {"samples": "first", "n_bins": 3},
)
ROB_PARAMS = ({}, {"uncertainty": "token_mean"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    path = root / "s.duckdb"
    con = connect(path)
    for suite, kwargs in (("clear", {"max_k": 1}), ("nota", {})):
        folder = root / suite
        build_mcq_suite(suite, folder, seed=5, **kwargs)
        run_reference_policies(con, folder, progress=False, policies=["calibrated", "chance"])
    con.close()
    return path


def _check(store, name: str, by: list[str], params: dict, prime: dict, prefix: str) -> None:
    with _plain_and_prepared(store) as (views, tables):
        a = compute(views, name, by, params)
        # fill the caches first under keys that differ in one part each: parameters, then grouping
        compute(tables, name, by, prime)
        compute(tables, name, ["model"], params)
        b = compute(tables, name, by, params)
        n_tables, n_views = _kept(tables, prefix), _kept(views, prefix)
    assert len(a) > 0
    assert n_tables >= 2 and n_views == 0  # the cache is used, and only where the relations are fixed
    _same(a, b)


@pytest.mark.parametrize("name", CAL)
@pytest.mark.parametrize("by", BYS)
@pytest.mark.parametrize("params", CAL_PARAMS)
def test_calibration_caches_match_the_views(store, name, by, params):
    prime = {"confidence": "token_mean"}  # no token log-probabilities here: an empty cache entry
    _check(store, name, by, params, prime, "_cal_samples_")


@contextlib.contextmanager
def _plain_and_prepared(store) -> Iterator[tuple[duckdb.DuckDBPyConnection, duckdb.DuckDBPyConnection]]:
    """Two read-only connections to ``store``: one with the plain views (no caches), one prepared
    for a pass (fixed relations, so the metrics keep their caches)."""
    _load_all()
    views = duckdb.connect(str(store), read_only=True)
    tables = duckdb.connect(str(store), read_only=True)
    try:
        prepare(tables, materialize=True)
        yield views, tables
    finally:
        views.close()
        tables.close()


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """The cached connection's frame equals the plain views' frame (to summation-order rounding)."""
    pd.testing.assert_frame_equal(
        a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False, rtol=1e-12
    )


def _kept(con: duckdb.DuckDBPyConnection, prefix: str) -> int:
    """How many TEMP tables whose name starts with ``prefix`` the connection holds (cache entries)."""
    q = "SELECT count(*) FROM duckdb_tables() WHERE temporary AND starts_with(table_name, ?)"
    return con.execute(q, [prefix]).fetchone()[0]


@pytest.mark.parametrize("by", BYS)
@pytest.mark.parametrize("params", CAL_PARAMS)
def test_aurc_and_prr_share_their_query_rows(store, by, params):
    """aurc and prr keep the rows of their shared query per (confidence, samples, by): whichever
    runs second reads the first one's rows and still gives the numbers of the plain views."""
    with _plain_and_prepared(store) as (views, tables):
        for first, second in (("aurc", "prr"), ("prr", "aurc")):
            compute(tables, first, by, {"confidence": "token_mean"})  # another key: must not be served
            compute(tables, first, by, params)
            _same(compute(views, second, by, params), compute(tables, second, by, params))
        n = _kept(tables, "_cal_selective_")
    assert n == 2  # one per key: (token_mean, by) and (params, by)


@pytest.mark.parametrize("by", BYS)
@pytest.mark.parametrize("params", CAL_PARAMS)
def test_tie_blocks_by_one_sort_equal_the_windowed_blocks(store, by, params):
    """On a connection with fixed relations the tie blocks come from one sort and a streaming scan
    (cal_blocks_sorted.sql), which needs insertion order; without it they come from the windowed
    cal_blocks.sql. Both give the same rows, so the metrics that read them agree bit for bit."""
    names = ("auroc", "aurc", "risk_coverage")
    with _plain_and_prepared(store) as (_, tables):
        want = {name: compute(tables, name, by, params) for name in names}
        n_sorted = _kept(tables, "_cal_blocks_")
    with _plain_and_prepared(store) as (_, tables):
        # this connection only (a plain SET is global: every connection of the process would see it)
        tables.execute("SET SESSION preserve_insertion_order = false")
        got = {name: compute(tables, name, by, params) for name in names}
        n_windowed = _kept(tables, "_cal_blocks_")
    for name in names:
        assert len(want[name]) > 0
        pd.testing.assert_frame_equal(got[name], want[name], check_exact=True, obj=name)
    # the sorted path keeps its groups' table beside the blocks, the windowed one does not
    assert (n_sorted, n_windowed) == (2, 1)


@pytest.mark.parametrize("by", BYS)
def test_ece_and_reliability_bins_are_kept_per_bin_count(store, by):
    """ece and reliability read one per-bin TEMP table per (confidence, samples, by, n_bins): after
    one bin count filled it, another bin count, and the other metric, still give the views' numbers."""
    with _plain_and_prepared(store) as (views, tables):
        for name, params in (
            ("ece", {}),
            ("reliability", {}),
            ("reliability", {"n_bins": 7}),
            ("ece", {"n_bins": 7}),
        ):
            _same(compute(views, name, by, params), compute(tables, name, by, params))
        n = _kept(tables, "_cal_bins_")
    assert n == 2


@pytest.mark.parametrize("name", ROB)
@pytest.mark.parametrize("by", BYS)
@pytest.mark.parametrize("params", ROB_PARAMS)
def test_robustness_pairs_cache_matches_the_views(store, name, by, params):
    prime = {} if params else {"uncertainty": "token_mean"}
    _check(store, name, by, {**params, "n_boot": 50} if "bootstrap" in name else params, prime, "_rob_")


UNC = ("unc_normalization_bounds", "unc_normalized")
UNC_PARAMS = (
    {},
    {"scores": ["avg_nll", "n_wait"], "upper_quantile": 0.9},
    {"pool": "base", "holdout_fraction": 0.5, "split_key": "base_id"},
)


@pytest.mark.parametrize("name", UNC)
@pytest.mark.parametrize("by", BYS)
@pytest.mark.parametrize("params", UNC_PARAMS)
def test_uncertainty_bounds_cache_matches_the_views(store, name, by, params):
    """unc_normalization_bounds keeps its per-group bounds in a TEMP table and unc_normalized reads
    them from there: both give the numbers of the plain views, after the cache was filled
    under other parameters and another grouping (a key that missed a part would serve those)."""
    from equipoise.evaluators.metrics.uncertainty import _normalized_sql

    prime = {"scores": ["avg_nll"], "upper_quantile": 0.5} if params == {} else {}
    extra = {"include_holdout": True} if name == "unc_normalized" and params else {}
    with _plain_and_prepared(store) as (views, tables):
        a = compute(views, name, by, {**params, **extra})
        for b_, p_ in ((by, prime), (["model"], params), (by, params)):
            compute(tables, "unc_normalization_bounds", b_, p_)
        b = compute(tables, name, by, {**params, **extra})
        reads_cache = "FROM _unc_bounds_" in _normalized_sql(
            tables, by, {**REGISTRY["unc_normalized"].params, **params}
        )
        n_tables, n_views = _kept(tables, "_unc_bounds_"), _kept(views, "_unc_bounds_")
    assert len(a) > 0 and reads_cache
    assert n_tables == (2 if by == ["model"] else 3) and n_views == 0
    # not bit-exact: the scores' own sums (option entropy) may add in another order over views
    _same(a, b)


CONF_BYS = ([], ["model"], ["variant", "k"], ["model", "condition"])
CONF_PARAMS = ({}, {"alpha": 0.2, "repeats": 70, "stratify": None}, {"alpha": "1/3", "cal_fraction": 0.5})


@pytest.mark.parametrize("by", CONF_BYS)
@pytest.mark.parametrize("params", CONF_PARAMS)
def test_conformal_threshold_cache_matches_the_views(store, by, params):
    """conformal_lac, plain conformal_aps and conformal_coverage_by (score 'lac' / 'aps') keep their
    thresholds q_hat in a TEMP table per mask, score and alpha (``conformal._threshold_table``), and
    the first of them computes them for the others; coverage_by keeps its per-value test sums, which
    conformal_lac / conformal_aps then add up per group (``conformal._test_rep_prefix``). Each still
    gives the numbers of the plain views (which compute everything in their own query) after the
    caches were filled under another alpha, another score, another mask and another grouping (a key
    that missed a part would serve those rows)."""
    other_alpha = {**params, "alpha": 0.3}
    with _plain_and_prepared(store) as (views, tables):
        compute(tables, "conformal_lac", by, other_alpha)
        compute(tables, "conformal_lac", ["model", "config"], params)
        for name, extra in (
            ("conformal_coverage_by", {"score": "aps"}),  # reads no LAC row: another score
            ("conformal_coverage_by", {"coverage_by": "target_role", "stratify": None}),  # another mask
            # LAC thresholds of conformal_lac; its 10 values split every group's test units
            ("conformal_coverage_by", {"coverage_by": "specialty"}),
            ("conformal_lac", {}),  # reads coverage_by's thresholds and test sums
            ("conformal_aps", {}),  # reads coverage_by's APS thresholds and test sums
        ):
            p = {**params, **extra}
            if name == "conformal_coverage_by" and "coverage_by" in p and p["coverage_by"] in by:
                continue
            a = compute(views, name, by, p)
            assert len(a) > 0
            # integer sums and the same q_hat: the same bits, not just to rounding
            b = compute(tables, name, by, p).reset_index(drop=True)
            pd.testing.assert_frame_equal(a.reset_index(drop=True), b, check_exact=True)
        n_tables, n_views = _kept(tables, "_conf_thr_"), _kept(views, "_conf_thr_")
        n_sums, n_sums_views = _kept(tables, "_conf_trep_"), _kept(views, "_conf_trep_")
    assert n_tables >= 4 and n_views == 0
    assert n_sums == 3 and n_sums_views == 0
