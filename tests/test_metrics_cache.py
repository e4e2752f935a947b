"""`equipoise metrics` caches results per store content: a second call on an unchanged store computes
nothing and prints the same bytes; any write to the store gives fresh results."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from equipoise.cli import app
from equipoise.evaluators.metrics import cache, registry
from equipoise.evaluators.store import connect
from equipoise.evaluators.synthetic import SyntheticSpec, make_store

runner = CliRunner()


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s.duckdb"
    make_store(path, SyntheticSpec(n_items=40, models=("m1", "m2"), samples=2, unparsed_rate=0.1, seed=4))
    return path


def _metrics(store: Path, *args: str) -> str:
    r = runner.invoke(app, ["metrics", "--store", str(store), *args])
    assert r.exit_code == 0, r.output
    return r.output


def _refuse_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("computed although the store is unchanged")

    monkeypatch.setattr(registry, "compute", boom)
    monkeypatch.setattr(registry, "write_result", boom)
    monkeypatch.setattr(registry, "prepare", boom)


@pytest.mark.parametrize("fmt", ["json", "md", "csv"])
def test_unchanged_store_is_served_from_the_cache(store: Path, monkeypatch, fmt: str) -> None:
    args = ("--format", fmt)  # every metric, default grouping
    first = _metrics(store, *args)
    assert len(list(cache.cache_dir(store).glob("*.parquet"))) == len(registry.REGISTRY)
    with monkeypatch.context() as m:
        _refuse_compute(m)
        assert _metrics(store, *args) == first
    if fmt == "json":  # computing again agrees (to the last bits a parallel double sum may move)
        again = json.loads(_metrics(store, *args, "--no-cache"))
        want = json.loads(first)
        assert again.keys() == want.keys()
        for name in want:
            pd.testing.assert_frame_equal(pd.DataFrame(again[name]), pd.DataFrame(want[name]), rtol=1e-12)


def test_out_files_from_the_cache_are_the_computed_files(store: Path, tmp_path: Path, monkeypatch) -> None:
    _metrics(store, "--out", str(tmp_path / "a"))
    with monkeypatch.context() as m:
        _refuse_compute(m)
        _metrics(store, "--out", str(tmp_path / "b"))
    for f in sorted((tmp_path / "a").glob("*.parquet")):
        assert (tmp_path / "b" / f.name).read_bytes() == f.read_bytes()


def test_a_write_to_the_store_is_never_served_from_the_cache(store: Path) -> None:
    before = json.loads(_metrics(store, "--format", "json", "--metric", "answer_rates"))
    con = connect(store)
    con.execute("UPDATE predictions SET parsed_label = NULL, outcome = 'unparsed' WHERE sample_index = 1")
    con.close()
    after = json.loads(_metrics(store, "--format", "json", "--metric", "answer_rates"))
    fresh = json.loads(_metrics(store, "--format", "json", "--metric", "answer_rates", "--no-cache"))
    pd.testing.assert_frame_equal(
        pd.DataFrame(after["answer_rates"]), pd.DataFrame(fresh["answer_rates"]), rtol=1e-12
    )
    assert not pd.DataFrame(after["answer_rates"]).equals(pd.DataFrame(before["answer_rates"]))
    assert pd.DataFrame(after["answer_rates"]).shape == pd.DataFrame(before["answer_rates"]).shape


def test_an_unwritable_cache_folder_only_disables_the_cache(store: Path) -> None:
    cache.cache_dir(store).write_text("a file where the folder would be")
    out = _metrics(store, "--format", "json", "--metric", "answer_rates")
    assert json.loads(out)["answer_rates"]


def test_changed_metric_code_is_never_served_from_the_cache(store: Path, monkeypatch) -> None:
    """Same store, same package version, other metric code (an editable install between commits):
    the old result must not be served, so the digest of the metric sources is part of the key."""
    _metrics(store, "--format", "json", "--metric", "answer_rates")
    with monkeypatch.context() as m:
        _refuse_compute(m)
        _metrics(store, "--format", "json", "--metric", "answer_rates")  # same code: a hit
    monkeypatch.setattr(cache, "code_digest", lambda: "other metric code")
    calls: list[str] = []
    real = registry.compute

    def counting(con, name, *a, **k):
        calls.append(name)
        return real(con, name, *a, **k)

    monkeypatch.setattr(registry, "compute", counting)
    _metrics(store, "--format", "json", "--metric", "answer_rates")
    assert calls == ["answer_rates"]


def test_code_digest_changes_with_any_metric_sql_or_module(tmp_path: Path, monkeypatch) -> None:
    """The digest reads the metric package's files: a one-byte change to a SQL file or a module
    gives another digest (checked on a copy of the package, never on the installed files)."""
    import shutil

    pkg = tmp_path / "metrics"
    shutil.copytree(Path(cache.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "__file__", str(pkg / "cache.py"))
    digests = []
    for edit in (None, pkg / "sql" / "answer_rates.sql", pkg / "calibration.py"):
        if edit is not None:
            edit.write_bytes(edit.read_bytes() + b"\n")
        cache.code_digest.cache_clear()
        digests.append(cache.code_digest())
    cache.code_digest.cache_clear()
    assert len(set(digests)) == 3
