"""Every registered metric, on one store that has data for all of them, grouped by every stratum.

Metric SQL splices the grouping columns into its query, so an internal column that shares a name
with a stratum (``k``, ``condition``, ...) silently changes meaning when a user groups by it; DuckDB
renames the clash to ``k_1`` instead of failing. This test runs each metric under every grouping and
checks the shape of what comes back, and that the materialized base tables (what ``equipoise
metrics`` and ``report`` use) give the same numbers as the views.
"""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from equipoise.builders.clindet_suite import build_clindet
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.evaluators.metrics.registry import REGISTRY, STRATA, _load_all, compute, prepare
from equipoise.evaluators.reference_run import run_reference_policies
from equipoise.evaluators.store import connect

# parameters that keep resampling metrics fast; each is given only to metrics that declare it
FAST = {"repeats": 2, "n_boot": 40}
POLICIES = ["calibrated", "chance", "always_abstain"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("reg")
    path = root / "s.duckdb"
    con = connect(path)
    clindet = root / "clindet"
    build_clindet(clindet, per_system=2, seed=3, progress=False)
    run_reference_policies(con, clindet, progress=False, policies=POLICIES)
    for suite, kwargs in (("clear", {"max_k": 1}), ("nota", {})):
        folder = root / suite
        build_mcq_suite(suite, folder, seed=3, **kwargs)
        run_reference_policies(con, folder, progress=False, policies=POLICIES)
    con.close()
    return path


def _params(name: str) -> dict:
    return {k: v for k, v in FAST.items() if k in REGISTRY[name].params}


def _metrics() -> list[str]:
    _load_all()
    return sorted(REGISTRY)


@pytest.mark.parametrize("name", _metrics())
def test_every_grouping_keeps_its_shape(store, name):
    con = duckdb.connect(str(store), read_only=True)
    try:
        prepare(con, materialize=True)
        base = compute(con, name, None, _params(name))
        assert isinstance(base, pd.DataFrame) and len(base.columns) == len(set(base.columns))
        for by in ([], *[[s] for s in STRATA]):
            try:
                df = compute(con, name, by, _params(name))
            except ValueError as exc:  # a metric may refuse a grouping it cannot honour, by name
                assert by and by[0] in str(exc), (name, by, exc)
                continue
            cols = list(df.columns)
            assert len(cols) == len(set(cols)), (name, by, cols)
            assert not [c for c in cols if c.endswith("_1")], (name, by, cols)  # DuckDB's clash rename
            # the tradeoff correlates accuracies across the groups `by` defines, reported in points_by
            keys = ["points_by"] if name == "determinability_tradeoff" else by
            for col in keys:
                assert col in cols, (name, by, cols)
    finally:
        con.close()


@pytest.mark.parametrize("name", _metrics())
def test_materialized_base_tables_give_the_same_numbers(store, name):
    views = duckdb.connect(str(store), read_only=True)
    tables = duckdb.connect(str(store), read_only=True)
    try:
        a = compute(views, name, None, _params(name))
        prepare(tables, materialize=True)
        b = compute(tables, name, None, _params(name))
    finally:
        views.close()
        tables.close()
    pd.testing.assert_frame_equal(
        a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False, rtol=1e-12
    )
