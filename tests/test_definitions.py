"""Bundled definitions: coverage, published examples, and clear errors for malformed files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from equipoise.scoring_systems.engine import evaluate
from equipoise.scoring_systems.loader import DEFINITIONS_DIR, DefinitionError, load_definition
from tests.conftest import SYSTEMS

TABLE_A1 = {
    "a_drop",
    "alvarado",
    "apgar",
    "bisap",
    "bishop",
    "glasgow_blatchford",
    "chads2",
    "child_pugh",
    "curb_65",
    "glasgow_imrie",
    "has_bled",
    "khorana",
    "centor",
    "orbit",
    "qsofa",
    "sirs",
}


def test_table_a1_systems_and_at_least_eight_more():
    assert set(SYSTEMS) >= TABLE_A1
    assert "mcisaac" in SYSTEMS and SYSTEMS["mcisaac"].variant_of == "centor"
    extra = set(SYSTEMS) - TABLE_A1 - {"mcisaac"}
    assert len(extra) >= 8, extra
    assert len(SYSTEMS) >= 24


@pytest.mark.parametrize("system_id", sorted(SYSTEMS))
def test_definition_has_sources_criteria_and_examples(system_id):
    s = SYSTEMS[system_id]
    assert any(r.role == "original" for r in s.references) or s.variant_of
    assert sum(c.primary for c in s.criteria) == 1
    complete = [e for e in s.examples if e.total is not None]
    partial = [e for e in s.examples if e.total_min is not None]
    assert len(complete) >= 2 and len(partial) >= 1


EXAMPLES = [(sid, i) for sid in sorted(SYSTEMS) for i in range(len(SYSTEMS[sid].examples))]


@pytest.mark.parametrize(("system_id", "index"), EXAMPLES)
def test_published_example(system_id, index):
    """Worked examples written from each publication's point table."""
    s = SYSTEMS[system_id]
    ex = s.examples[index]
    ev = evaluate(s, ex.findings)
    if ex.total is not None:
        assert ev.complete, f"{ex.description}: expected complete, missing {ev.missing}"
        assert ev.total == ex.total, ex.description
    if ex.total_min is not None:
        assert ev.s_min == ex.total_min, ex.description
    if ex.total_max is not None:
        assert ev.s_max == ex.total_max, ex.description
    for crit, label in ex.expected.items():
        assert ev.label(crit) == label, f"{ex.description}: {crit}"


def _chads2_raw() -> dict:
    return yaml.safe_load((DEFINITIONS_DIR / "chads2.yaml").read_text())


def _write(tmp_path: Path, data: dict, name: str = "chads2") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_bundled_file_roundtrips(tmp_path):
    assert load_definition(_write(tmp_path, _chads2_raw())).id == "chads2"


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (lambda d: d["items"][0].update(pointz=1), "items.0.binary.pointz", "Extra inputs"),
        (lambda d: d["items"][0].update(input="no_such"), "<root>", "unknown input 'no_such'"),
        (lambda d: d["criteria"][0].pop("ge"), "criteria.0", "needs at least one bound"),
        (lambda d: d["inputs"][0].update(min=200), "inputs.0.numeric", "must be below max"),
        (lambda d: d["items"][2]["bands"].append({"ge": 70, "points": 3}), "items.a.bands", "overlap"),
        (lambda d: d["criteria"][0].update(ge=99), "criteria.high_risk", "always 'Not met'"),
        (lambda d: d["references"][0].pop("year"), "references.0.year", "Field required"),
        (
            lambda d: (d["items"][2]["bands"][0].update(lt=74.5), d["items"][2]["bands"][1].update(ge=74.6)),
            "inputs.age",
            "use a finer step",
        ),
    ],
)
def test_malformed_definition_names_file_field_and_reason(tmp_path, mutate, field, reason):
    data = _chads2_raw()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(DefinitionError) as exc:
        load_definition(path)
    msg = str(exc.value)
    assert str(path) in msg and field in msg and reason in msg, msg


def test_bad_yaml_and_wrong_id(tmp_path):
    p = tmp_path / "chads2.yaml"
    p.write_text("id: [unclosed")
    with pytest.raises(DefinitionError, match="not valid YAML"):
        load_definition(p)
    p2 = _write(tmp_path, _chads2_raw(), name="other")
    with pytest.raises(DefinitionError, match="must equal the file name"):
        load_definition(p2)
