"""Nothing silently empty: user errors of `equipoise build` exit 2 with one line naming the fix, leave no
output folder behind, and every build writes a report of items in / out per config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from equipoise.builders.mcq_build import BUILD_REPORT, BuildError, build_mcq_suite
from equipoise.builders.validate import validate_folder
from equipoise.cli import app
from tests.conftest import load_local

FIX = Path(__file__).resolve().parent / "fixtures" / "sources"
GENERIC = f"generic:{FIX / 'generic' / 'questions.csv'}?mapping={FIX / 'generic' / 'mapping.yaml'}"
MEDQA4 = f"medqa4:{FIX / 'medqa4'}"


def _build(*args: str):
    return CliRunner().invoke(app, ["build", *args])


def _assert_user_error(result, out: Path, *needles: str) -> str:
    """Exit 2, one line naming what is asked, no traceback, and no folder (nor staging folder) left."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    text = " ".join(result.output.split())  # the console wraps long lines
    assert "Traceback" not in result.output
    for n in needles:
        assert n in text, (n, text)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return text


def test_source_without_key_facts_or_edits_exits_2_naming_the_fix(tmp_path):
    """The issue's case: a source with no key facts gave NAP / AP with 0 items and exit 0."""
    out = tmp_path / "ds"
    r = _build("medabstain", "--out", str(out), "--source", MEDQA4)
    text = _assert_user_error(
        r, out, "NAP, AP: 0 of 3 items have a key fact or an edit", "--context-removal llm", "--edits FILE"
    )
    assert "--configs NA,A,pool_NA,pool_A" in text
    # the suggested subset builds, and only it
    r = _build("medabstain", "--out", str(out), "--source", MEDQA4, "--configs", "NA,A")
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["configs"]) == ["A", "NA"] and manifest["pool_configs"] == []
    assert manifest["eval_configs"] == ["NA", "A"]
    assert validate_folder(out).ok
    assert load_local(out, "A").num_rows == 3


def test_unknown_eval_split_lists_the_splits(tmp_path):
    for suite in ("clear", "nota", "shuffle", "medabstain"):
        out = tmp_path / suite
        r = _build(suite, "--out", str(out), "--source", MEDQA4, "--eval-split", "validation")
        _assert_user_error(
            r, out, "--eval-split 'validation': the source has no such split", "test (3 items)"
        )


def test_unknown_pool_split_lists_the_splits(tmp_path):
    out = tmp_path / "ds"
    r = _build("medabstain", "--out", str(out), "--pool-split", "dev")
    _assert_user_error(r, out, "--pool-split 'dev'", "train (", "--configs NA,A,NAP,AP")
    r = _build("medabstain", "--out", str(out), "--pool-split", "dev", "--configs", "NA,A,NAP,AP")
    assert r.exit_code == 0, r.output


def test_unknown_config_and_bad_options(tmp_path):
    out = tmp_path / "ds"
    _assert_user_error(
        _build("medabstain", "--out", str(out), "--configs", "NA,XX"), out, "unknown config(s) XX"
    )
    _assert_user_error(
        _build("nota", "--out", str(out), "--configs", "k1_gold"), out, "this build has: original"
    )
    _assert_user_error(
        _build("medabstain", "--out", str(out), "--abstain-position", "middle"), out, "random, first, last"
    )
    _assert_user_error(
        _build("medabstain", "--out", str(out), "--context-removal", "foo"), out, "use span or llm"
    )
    _assert_user_error(_build("medabstain", "--out", str(out), "--pool-size", "0"), out, "--pool-size 0")


def test_failed_rebuild_keeps_the_earlier_dataset(tmp_path):
    out = tmp_path / "ds"
    build_mcq_suite("nota", out, seed=1)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(BuildError):
        build_mcq_suite("nota", out, seed=1, eval_split="nope")
    with pytest.raises(BuildError, match="this build has"):
        build_mcq_suite("nota", out, seed=1, configs=["missing"])
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # a folder with other content is never replaced by a build
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    with pytest.raises(BuildError, match="not a dataset folder"):
        build_mcq_suite("nota", other, seed=1)
    assert (other / "mine.txt").read_text() == "keep"


def test_build_report_counts_every_item(tmp_path):
    out = tmp_path / "ds"
    m = build_mcq_suite("clear", out, seed=2, source=MEDQA4)
    report = json.loads((out / BUILD_REPORT).read_text())
    assert m["build_report"] == BUILD_REPORT and BUILD_REPORT in m["files"]  # hashed like any file
    assert report["source_items"] == 6 and report["source_splits"] == {"test": 3, "train": 3}
    for name, c in report["configs"].items():
        assert c["items_in"] == 3 and c["items_out"] + c["dropped"] == 3, name
        assert c["rows"] == m["configs"][name]["rows"]
    card = (out / "README.md").read_text()
    assert "## Build counts" in card and "| `k1_gold` | 3 | 3 | 3 | 0 |" in card
    assert validate_folder(out).ok
    # the report is covered by the manifest: editing it is caught
    (out / BUILD_REPORT).write_text("{}")
    assert any(BUILD_REPORT in p for p in validate_folder(out).problems)


def test_dropped_items_are_listed_with_their_reason(tmp_path):
    """Items with too few distractors for a CLEAR k are dropped from that config, each with a reason."""
    out = tmp_path / "ds"
    build_mcq_suite("clear", out, seed=2, source=GENERIC)
    report = json.loads((out / BUILD_REPORT).read_text())
    assert report["dropped"] == [] or all(d["reason"] for d in report["dropped"])
    for c in report["configs"].values():
        assert c["items_out"] + c["dropped"] == c["items_in"]


def test_validate_names_an_empty_config(tmp_path):
    """A folder with an empty config (as older builds wrote) gets a plain message, not a dtype error."""
    import pyarrow.parquet as pq

    from equipoise.builders.dataset_writer import sha256_file, write_manifest

    out = tmp_path / "ds"
    m = build_mcq_suite("nota", out, seed=1)
    path = out / m["configs"]["plus_nota"]["path"]
    pq.write_table(pq.read_table(path).slice(0, 0), path)
    man = json.loads((out / "manifest.json").read_text())
    man["files"][m["configs"]["plus_nota"]["path"]] = sha256_file(path)
    man["configs"]["plus_nota"]["rows"] = 0
    write_manifest(out, man)
    problems = validate_folder(out).problems
    assert problems == [f"{path}: config 'plus_nota' has 0 rows (an empty config is never published)"]
