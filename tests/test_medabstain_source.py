"""`--source medabstain:DIR_OR_FILE` on a folder laid out like the MedAbstain release (synthetic rows in
the release's exact shape, see tests/medabstain_release.py), and `--edits FILE` for any source."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from equipoise.builders.mcq_build import BUILD_REPORT, build_mcq_suite
from equipoise.builders.sources.mini import SourceError
from equipoise.builders.sources.registry import load_full
from equipoise.builders.validate import validate_folder
from equipoise.cli import app
from equipoise.schemas.items import MCQItem
from tests.conftest import load_local
from tests.medabstain_release import ABSTAIN, TEST, write_release

FIX = Path(__file__).resolve().parent / "fixtures" / "sources"
MEDQA4 = f"medqa4:{FIX / 'medqa4'}"


def _load(folder: Path, name: str) -> list[MCQItem]:
    return [MCQItem.model_validate(r) for r in load_local(folder, name)]


def _text(result) -> str:
    return " ".join(result.output.split())


def test_release_folder_builds_na_a_nap_ap_with_the_release_edits(tmp_path):
    rel = write_release(tmp_path / "release")
    out = tmp_path / "ds"
    r = CliRunner().invoke(app, ["build", "medabstain", "--source", f"medabstain:{rel}", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(app, ["validate", str(out)]).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["eval_configs"] == ["NA", "A", "NAP", "AP"]
    rows = {name: _load(out, name) for name in manifest["configs"]}  # every config loads with datasets
    perturbed = json.loads((rel / "perturbed_medqa_1_test_noabst.json").read_text())
    pert_sha = hashlib.sha256((rel / "perturbed_medqa_1_test_noabst.json").read_bytes()).hexdigest()
    randabst = {r["id"]: r for r in json.loads((rel / "medqa_1_test_randabst.json").read_text())}
    for name in ("NA", "A", "NAP", "AP"):
        assert len(rows[name]) == len(TEST), name  # every test item, in every variant
    nap = {i.source.source_id: i for i in rows["NAP"]}
    for n, row in enumerate(perturbed, start=1):
        item = nap[str(row["id"])]
        assert item.question == row["question"] and item.abstain_expected  # the release's perturbed text
        step = item.provenance[-1]
        params = step.params
        assert params["method"] == "imported" and params["file"] == "perturbed_medqa_1_test_noabst.json"
        assert (
            params["sha256"] == pert_sha and params["row"] == n and params["producer"] == "MedAbstain release"
        )
        assert params["source_gold_context"] == row["meta"]["gold_context"]
        assert params["source_reason"] == row["meta"]["reason"]
        assert (
            step.removed_text == row["meta"]["gold_context"]
            and step.original_question == row["original_question"]
        )
    # the paraphrased gold context (not a span of the question) is accepted, without an alignment
    assert nap["1"].provenance[-1].params["removed_text_alignment"] is None
    assert nap["0"].provenance[-1].params["removed_text_alignment"] == "100.0"
    # A: the release's abstain choice, at the release's letter; AP = NAP + that option, same position
    a = {i.source.source_id: i for i in rows["A"]}
    ap = {i.source.source_id: i for i in rows["AP"]}
    for sid, item in a.items():
        abst = [o for o in item.options if o.role == "abstain"]
        assert len(abst) == 1 and abst[0].text == ABSTAIN
        release_letter = next(k for k, v in randabst[int(sid)]["choices"].items() if v == ABSTAIN)
        assert abst[0].label == release_letter
        assert ap[sid].question == nap[sid].question
        assert [o.option_id for o in ap[sid].options] == [o.option_id for o in item.options]
    text = _text(r)
    assert "differ from its NAP questions in 1 of 4 items" in text
    card = (out / "README.md").read_text()
    assert "differ from its NAP questions in 1 of 4 items" in " ".join(card.split())
    # pools: the release's pool items, the blended pool's perturbed rows as edits
    assert len(rows["pool_NA"]) == 4
    pna = rows["pool_P-NA"]
    assert sum(i.abstain_expected for i in pna) == 1  # 50% of the 2 perturbable pool items
    report = json.loads((out / BUILD_REPORT).read_text())
    assert report["source_splits"] == {"test": 4, "train": 4, "validation": 2}
    assert report["configs"]["NAP"] == {"items_in": 4, "items_out": 4, "rows": 4, "dropped": 0}


def test_release_without_pool_files_builds_and_says_so(tmp_path):
    rel = write_release(tmp_path / "release", pools=False)
    out = tmp_path / "ds"
    r = CliRunner().invoke(app, ["build", "medabstain", "--source", f"medabstain:{rel}", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "no few-shot pools" in _text(r)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["configs"]) == ["A", "AP", "NA", "NAP"] and manifest["pool_configs"] == []
    assert "no few-shot pools" in " ".join((out / "README.md").read_text().split())
    assert validate_folder(out).ok
    # asking for a pool explicitly is an error naming the splits that exist
    r = CliRunner().invoke(
        app,
        [
            "build",
            "medabstain",
            "--source",
            f"medabstain:{rel}",
            "--out",
            str(tmp_path / "p"),
            "--configs",
            "pool_NA",
        ],
    )
    assert r.exit_code == 2 and "--pool-split 'train'" in _text(r) and "validation (2 items)" in _text(r)


def test_release_build_is_byte_identical(tmp_path):
    rel = write_release(tmp_path / "release")
    m1 = build_mcq_suite("medabstain", tmp_path / "a", source=f"medabstain:{rel}", seed=3)
    m2 = build_mcq_suite("medabstain", tmp_path / "b", source=f"medabstain:{rel}", seed=3)
    assert m1 == m2
    for rel_path in m1["files"]:
        assert (tmp_path / "a" / rel_path).read_bytes() == (tmp_path / "b" / rel_path).read_bytes()


def test_single_files_of_the_release(tmp_path):
    rel = write_release(tmp_path / "release")
    # the perturbed file alone: NA from its original questions, NAP from its edits
    loaded = load_full(f"medabstain:{rel / 'perturbed_medqa_1_test_noabst.json'}")
    assert len(loaded.items) == 4 and len(loaded.edits) == 4
    assert loaded.items[0].question == TEST[0][0]
    # the plain file alone: NAP cannot be built, and the build says how to fix it
    out = tmp_path / "ds"
    r = CliRunner().invoke(
        app,
        [
            "build",
            "medabstain",
            "--source",
            f"medabstain:{rel / 'medqa_1_test_noabst.json'}",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 2 and not out.exists() and "Traceback" not in r.output
    assert (
        "NAP, AP: 0 of 4 items have a key fact or an edit; use --context-removal llm, --edits FILE"
        in _text(r)
    )
    r = CliRunner().invoke(
        app,
        [
            "build",
            "medabstain",
            "--source",
            f"medabstain:{rel / 'medqa_1_test_noabst.json'}",
            "--out",
            str(out),
            "--configs",
            "NA,A",
        ],
    )
    assert r.exit_code == 0, r.output
    # the validation file is the calibration split
    r = CliRunner().invoke(
        app,
        [
            "build",
            "medabstain",
            "--source",
            f"medabstain:{rel}",
            "--out",
            str(tmp_path / "val"),
            "--eval-split",
            "validation",
            "--configs",
            "NA,A",
        ],
    )
    assert r.exit_code == 0, r.output
    assert load_local(tmp_path / "val", "NA").num_rows == 2


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda rows: rows[1].pop("question"),
            "medqa_1_test_noabst.json: row 2: field 'question': Field required",
        ),
        (lambda rows: rows[2].update(answer="Z"), "row 3: field 'answer': 'Z' is not among the choices"),
        (
            lambda rows: rows[0].update(choices={"B": "x", "A": "y"}),
            "row 1: field 'choices': letters ['B', 'A']",
        ),
    ],
)
def test_bad_release_rows_name_file_row_and_field(tmp_path, damage, message):
    rel = write_release(tmp_path / "release")
    path = rel / "medqa_1_test_noabst.json"
    rows = json.loads(path.read_text())
    damage(rows)
    path.write_text(json.dumps(rows))
    with pytest.raises(SourceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_full(f"medabstain:{rel}")


def test_options_abstain_text_position_and_pools(tmp_path):
    rel = write_release(tmp_path / "release")
    out = tmp_path / "ds"
    build_mcq_suite(
        "medabstain",
        out,
        source=f"medabstain:{rel}",
        abstain_text="I cannot answer this safely",
        abstain_position="first",
        pool_size=3,
        pool_perturbed_share=1.0,
    )
    for name in ("A", "AP", "pool_A"):
        for it in _load(out, name):
            assert it.options[0].role == "abstain" and it.options[0].text == "I cannot answer this safely"
    pool = _load(out, "pool_P-NA")
    assert len(pool) == 3
    perturbable = {"medabstain-train-200", "medabstain-train-202"} & {i.base_id for i in pool}
    assert {i.base_id for i in pool if i.abstain_expected} == perturbable  # share 1.0: all that can be
    build_mcq_suite("medabstain", tmp_path / "last", source=f"medabstain:{rel}", abstain_position="last")
    assert all(i.options[-1].role == "abstain" for i in _load(tmp_path / "last", "A"))


def test_edits_file_for_any_source(tmp_path):
    """Perturbations made elsewhere become NAP / AP with provenance, checked like every edit."""
    src = load_full(MEDQA4).items
    test = [i for i in src if i.source.split == "test"]
    edits = tmp_path / "edits.jsonl"
    lines = []
    for it in test:
        first = it.question.split(". ")[0] + "."
        lines.append(
            {
                "item_id": it.base_id,
                "perturbed_question": it.question.replace(first, "").strip(),
                "removed_text": first,
                "producer": "a person",
            }
        )
    edits.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "ds"
    r = CliRunner().invoke(
        app,
        [
            "build",
            "medabstain",
            "--source",
            MEDQA4,
            "--edits",
            str(edits),
            "--out",
            str(out),
            "--configs",
            "NA,A,NAP,AP",
        ],
    )
    assert r.exit_code == 0, r.output
    nap = _load(out, "NAP")
    assert len(nap) == len(test)
    assert all(i.provenance[-1].params["file"] == "edits.jsonl" for i in nap)
    assert all(i.provenance[-1].params["producer"] == "a person" for i in nap)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["edits"].startswith("edits.jsonl (sha256:")
    # a no-op edit is rejected and reported per item
    lines[0]["perturbed_question"] = test[0].question
    edits.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    m = build_mcq_suite("medabstain", tmp_path / "ds2", source=MEDQA4, edits=edits, configs=["NA", "NAP"])
    report = json.loads((tmp_path / "ds2" / BUILD_REPORT).read_text())
    assert m["configs"]["NAP"]["rows"] == len(test) - 1
    assert report["dropped"][0]["item"] == test[0].base_id and "no-op" in report["dropped"][0]["reason"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"item_id": "x"}\n', "edits.jsonl: row 1: field 'perturbed_question': Field required"),
        ("not json\n", "edits.jsonl: row 1: field '<json>': not valid JSON"),
        (
            '{"item_id": "nope", "perturbed_question": "q", "removed_text": "r"}\n',
            "edits.jsonl: row 1: field 'item_id': no source item has id 'nope'",
        ),
        (
            '{"item_id": "x", "perturbed_question": "q", "removed_text": "r", "colour": 1}\n',
            "edits.jsonl: row 1: field 'colour': Extra inputs are not permitted",
        ),
    ],
)
def test_bad_edits_rows_exit_2_naming_file_row_and_field(tmp_path, content, message):
    edits = tmp_path / "edits.jsonl"
    edits.write_text(content)
    out = tmp_path / "ds"
    r = CliRunner().invoke(
        app, ["build", "medabstain", "--source", MEDQA4, "--edits", str(edits), "--out", str(out)]
    )
    assert r.exit_code == 2 and message in _text(r) and "Traceback" not in r.output
    assert not out.exists()
