"""CLI behaviour, including one-line errors that name the offending finding."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from equipoise.cli import app
from tests.conftest import SYSTEMS

runner = CliRunner()


def test_help_explains_every_command():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for cmd in ("systems", "build", "validate", "quickstart", "sql"):
        assert cmd in res.output
    res = runner.invoke(app, ["systems", "score", "--help"])
    assert "reachable range" in res.output


def test_systems_list_json():
    res = runner.invoke(app, ["systems", "list", "--json"])
    assert res.exit_code == 0
    rows = json.loads(res.stdout)
    assert {r["id"] for r in rows} == set(SYSTEMS)


def test_systems_show_json_is_the_schema_form():
    from equipoise.schemas.scoring import ScoringSystem

    res = runner.invoke(app, ["systems", "show", "CURB-65", "--json"])
    assert res.exit_code == 0
    s = ScoringSystem.model_validate_json(res.stdout)
    assert s == SYSTEMS["curb_65"]


def test_score_complete_and_partial():
    res = runner.invoke(
        app,
        [
            "systems",
            "score",
            "chads2",
            "--json",
            "--findings",
            json.dumps(
                {
                    "age": 80,
                    "heart_failure": False,
                    "hypertension": True,
                    "diabetes": False,
                    "prior_stroke_tia": False,
                }
            ),
        ],
    )
    out = json.loads(res.stdout)
    assert out["complete"] and out["total"] == 2 and out["criteria"]["high_risk"]["label"] == "Met"
    res = runner.invoke(app, ["systems", "score", "chads2", "--findings", '{"age": 65}'])
    assert res.exit_code == 0 and "0..5" in res.output and "Unable to determine" in res.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["systems", "score", "nosuch"], "unknown scoring system 'nosuch'"),
        (["systems", "score", "chads2", "-f", '{"agee": 70}'], "unknown finding 'agee'"),
        (["systems", "score", "chads2", "-f", '{"age": 170}'], "finding 'age' = 170"),
        (["systems", "score", "chads2", "-f", '{"age": "old"}'], "finding 'age' must be a number"),
        (
            ["systems", "score", "chads2", "-f", '{"diabetes": "yes"}'],
            "finding 'diabetes' must be true or false",
        ),
        (
            ["systems", "score", "apgar", "-f", '{"skin_colour": "green"}'],
            "finding 'skin_colour' must be one of",
        ),
        (["systems", "score", "chads2", "-f", "{bad json"], "not valid JSON"),
        (["systems", "score", "chads2", "-f", "[1]"], "must be a JSON object"),
        (["build", "medabstainx", "--out", "x"], "unknown suite"),
    ],
)
def test_bad_input_is_one_line_naming_the_item(args, needle):
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert needle in text, res.output
    assert "Traceback" not in res.output


def test_build_cli_writes_loadable_dataset(tmp_path):
    out = tmp_path / "cd"
    res = runner.invoke(
        app,
        [
            "build",
            "clindet",
            "--out",
            str(out),
            "--per-system",
            "2",
            "--seed",
            "3",
            "--system",
            "qsofa",
            "--system",
            "CHADS2",
        ],
    )
    assert res.exit_code == 0, res.output
    m = json.loads((out / "manifest.json").read_text())
    assert set(m["sources"]) == {"qsofa", "chads2"}


def test_fail_reports_the_first_line_of_an_error_or_its_type(capsys):
    """An error ends the command with one line: the first line of a multi-line message, and the
    error's type name for an empty message (indexing its splitlines() would raise instead)."""
    import typer

    from equipoise.cli import _fail

    with pytest.raises(typer.Exit) as multi:
        _fail(ValueError("bad limit\n  context line"))
    with pytest.raises(typer.Exit) as empty:
        _fail(ValueError())
    out = capsys.readouterr().err
    assert multi.value.exit_code == empty.value.exit_code == 2
    assert "bad limit" in out and "context line" not in out
    assert "error: ValueError" in out
