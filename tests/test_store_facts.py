"""Write-time fact tables: every metric read from them equals the metric computed from the source
tables, and a store changed after the facts were written never serves a stale fact."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from equipoise.evaluators.metrics import facts
from equipoise.evaluators.metrics.registry import REGISTRY, _load_all, compute, prepare, uses_facts
from equipoise.evaluators.store import connect
from equipoise.evaluators.synthetic import SyntheticSpec, make_store

BYS: tuple[tuple[str, ...] | None, ...] = (None, ("suite", "variant"), ("specialty", "k"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("facts") / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=80, models=("m1", "m2"), samples=3, unparsed_rate=0.1, seed=7))
    con = connect(path)
    # abstentions and reasoning text, so the abstain and text-feature columns are not all zero
    con.execute(
        """
        UPDATE predictions SET outcome = 'abstained'
        FROM runs r, options o
        WHERE predictions.run_id = r.run_id AND o.dataset_id = r.dataset_id AND o.config = r.config
          AND o.item_id = predictions.item_id AND o.label = predictions.parsed_label
          AND o.role = 'abstain' AND predictions.outcome = 'answered';
        UPDATE predictions SET raw_output = 'Wait, maybe? ' || raw_output || ' Confidence: '
            || (hash(item_id || sample_index::VARCHAR) % 101)::VARCHAR || '%'
        WHERE hash(run_id || item_id) % 3 = 0;
        """
    )
    con.close()
    return path


def _metrics(path: Path, by: tuple[str, ...] | None) -> tuple[dict[str, pd.DataFrame], bool]:
    _load_all()
    con = connect(path, read_only=True)
    try:
        prepare(con, materialize=True)
        used = uses_facts(con)
        out: dict[str, pd.DataFrame] = {}
        for name in sorted(REGISTRY):
            try:
                out[name] = compute(con, name, by=None if by is None else list(by))
            except ValueError as exc:  # a metric that refuses this grouping must refuse it on both paths
                out[name] = pd.DataFrame({"refused": [str(exc)]})
        return out, used
    finally:
        con.close()


def _assert_same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)


@pytest.mark.parametrize("by", BYS, ids=lambda b: "default" if b is None else "-".join(b))
def test_metrics_from_facts_equal_metrics_from_source_tables(store: Path, tmp_path: Path, by) -> None:
    plain = tmp_path / "plain.duckdb"
    plain.write_bytes(store.read_bytes())
    want, used = _metrics(plain, by)
    assert not used  # no facts written: computed from the source tables
    con = connect(plain)
    assert facts.refresh(con) is True
    assert facts.refresh(con) is False  # unchanged store: nothing to do
    con.close()
    got, used = _metrics(plain, by)
    assert used
    assert sum(len(df) for df in got.values()) > 100
    _assert_same(got, want)


def test_a_write_after_refresh_is_never_served_stale(store: Path, tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    path.write_bytes(store.read_bytes())
    con = connect(path)
    facts.refresh(con)
    fp = facts.current(con)
    assert fp is not None
    con.close()
    before, used = _metrics(path, None)
    assert used
    con = connect(path)
    # a plain SQL update that keeps every row count: one correct answer becomes a wrong one
    con.execute(
        """
        UPDATE predictions SET parsed_label = CASE i.target_label WHEN 'A' THEN 'B' ELSE 'A' END
        FROM runs r, items i
        WHERE predictions.run_id = r.run_id AND i.dataset_id = r.dataset_id AND i.config = r.config
          AND i.item_id = predictions.item_id AND predictions.parsed_label = i.target_label
          AND predictions.rowid = (
              SELECT min(p.rowid) FROM predictions p JOIN runs r2 USING (run_id)
              JOIN items i2 ON i2.dataset_id = r2.dataset_id AND i2.config = r2.config
                           AND i2.item_id = p.item_id
              WHERE p.parsed_label = i2.target_label AND p.sample_index = 0)
        """
    )
    assert facts.current(con) is None and facts.fingerprint(con) != fp
    con.close()
    stale, used = _metrics(path, None)
    assert not used
    fresh = tmp_path / "fresh.duckdb"
    fresh.write_bytes(path.read_bytes())
    con = connect(fresh)
    facts.refresh(con)
    con.close()
    refreshed, used = _metrics(fresh, None)
    assert used
    _assert_same(stale, refreshed)
    # and the change is visible: the old facts would have given the old accuracy
    assert not before["answer_rates"].equals(stale["answer_rates"])
