"""The store refuses a DuckDB older than it works with, before it opens or creates anything, with an
error that names the installed version and the command that fixes it; pyproject.toml pins the same
bound."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import duckdb
import pytest

from equipoise.evaluators import store as st

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version", ["1.5.6", "1.4.4", "1.1.0", "0.10.3", "nightly"])
def test_older_or_unreadable_versions_are_refused_with_the_fix(version: str) -> None:
    with pytest.raises(st.DuckDBVersionError) as info:
        st.check_duckdb_version(version)
    message = str(info.value)
    assert f"installed: {version}" in message
    assert "pip install 'duckdb>=2.0,<3'" in message


@pytest.mark.parametrize("version", ["2.0.0", "2.0.1", "2.0.1.dev2610211350", "2.1.0", "2.10.3"])
def test_supported_versions_pass(version: str) -> None:
    st.check_duckdb_version(version)


def test_the_installed_duckdb_passes() -> None:
    st.check_duckdb_version()  # what every connection runs first


def test_an_old_duckdb_fails_before_any_file_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duckdb, "__version__", "1.5.6")
    path = tmp_path / "sub" / "store.duckdb"
    with pytest.raises(st.DuckDBVersionError, match=r"installed: 1\.5\.6"):
        st.connect(path)
    with pytest.raises(st.DuckDBVersionError):
        st.connect_memory()
    assert not path.parent.exists()  # not even its folder


def test_an_old_duckdb_leaves_a_store_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "store.duckdb"
    st.connect(path).close()
    before = path.read_bytes()
    monkeypatch.setattr(duckdb, "__version__", "1.4.4")
    for opening in (lambda: st.connect(path, read_only=True), lambda: st.migrate_store(path)):
        with pytest.raises(st.DuckDBVersionError):
            opening()
    assert path.read_bytes() == before
    assert not path.with_name(path.name + ".migrating").exists()


def test_pyproject_pins_the_same_lower_bound() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if re.match(r"duckdb\b", d)]
    lower = re.search(r">=\s*(\d+)\.(\d+)", pin)
    assert lower is not None, pin
    assert (int(lower.group(1)), int(lower.group(2))) == st.MIN_DUCKDB


def test_the_cli_says_it_in_one_line_where_a_store_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from equipoise.cli import app

    path = tmp_path / "store.duckdb"
    st.connect(path).close()
    monkeypatch.setattr(duckdb, "__version__", "1.5.6")
    runner = CliRunner()
    for args in (
        ["sql", "--store", str(path), "SELECT 1"],
        ["report", "--store", str(path), "--out", str(tmp_path / "report")],
        ["store", "migrate", str(path)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "installed: 1.5.6" in result.output and "Traceback" not in result.output, args
    # what opens no store still works: help at every level, the scoring systems
    for args in (["--help"], ["metrics", "--help"], ["store", "--help"], ["systems", "list"]):
        assert runner.invoke(app, args).exit_code == 0, args
