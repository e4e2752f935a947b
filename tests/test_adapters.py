"""Source adapters: each public layout read through ``datasets`` into typed items, with exact errors.

The fixtures under tests/fixtures/sources/ hold original questions in each source's published layout:

- medqa4/: ``GBaker/MedQA-USMLE-4-options`` (phrases_no_exclude_{train,test}.jsonl; question, answer,
  options {A-D}, meta_info, answer_idx, metamap_phrases).
- medqa5/US/: the original MedQA release (data_clean/questions/US/{train,dev,test}.jsonl; options A-E).
- medmcqa/hub/: ``openlifescienceai/medmcqa`` after its Parquet conversion (cop ClassLabel 0-3, test -1);
  medmcqa/raw/: the original release (JSON lines, cop 1-4, no cop in test.json).
- medexqa/: ``bluesky333/MedExQA`` (one config per specialty, header-less TSV, dev / test).
- pubmedqa/: ``qiaojin/PubMedQA`` config pqa_labeled (Parquet, one train split).
- gmai_mmbench/: ``OpenGVLab/GMAI-MMBench`` GMAI_mm_bench_VAL.tsv (+ a TEST part without 'answer').
- generic/: a CSV plus a column mapping.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from equipoise.builders.sources.mini import SourceError, content_revision
from equipoise.builders.sources.registry import SourceSpec, load
from tests.conftest import load_local

REPO_ROOT = Path(__file__).resolve().parent.parent
FIX = REPO_ROOT / "tests" / "fixtures" / "sources"


def _folder_revision(folder: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(files):
        h.update(
            f"{p.relative_to(folder).as_posix()}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode()
        )
    return "sha256:" + h.hexdigest()[:12]


def _by_id(items):
    return {i.item_id: i for i in items}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- spec
def test_spec_grammar():
    s = SourceSpec.parse("medqa4:GBaker/MedQA-USMLE-4-options@0fb93dd?splits=test,train&bad_rows=skip")
    assert (s.kind, s.location, s.revision) == ("medqa4", "GBaker/MedQA-USMLE-4-options", "0fb93dd")
    assert s.list_param("splits") == ["test", "train"] and s.params["bad_rows"] == "skip"
    s = SourceSpec.parse(f"medexqa:{FIX / 'medexqa'}?specialty=speech_pathologist")
    assert s.revision is None and s.is_local and s.list_param("specialty") == ["speech_pathologist"]
    assert SourceSpec.parse("pubmedqa:qiaojin/PubMedQA").params == {}
    s = SourceSpec.parse("pubmedqa:qiaojin/PubMedQA@refs/convert/parquet?config=pqa_labeled")
    assert (s.location, s.revision, s.params) == (
        "qiaojin/PubMedQA",
        "refs/convert/parquet",
        {"config": "pqa_labeled"},
    )
    for bad, why in [
        ("medqa4", "KIND:LOCATION"),
        ("medqa9:x/y", "unknown kind"),
        ("medqa4:x/y?specialty=a", "unknown key"),
        ("medqa4:x/y?splits=a&splits=b", "repeated"),
        ("medqa4:x/y?bad_rows=ignore", "bad_rows"),
        ("generic:x/y", "mapping"),
    ]:
        with pytest.raises(SourceError, match=why):
            SourceSpec.parse(bad)
    with pytest.raises(SourceError, match="not a local file or folder, nor a Hub repo id"):
        load("medqa4:/no/such/place.jsonl")


# ---------------------------------------------------------------------------------------------- MedQA
def test_medqa4_gbaker_layout():
    folder = FIX / "medqa4"
    items, rec = load(f"medqa4:{folder}")
    assert len(items) == 6 and rec["name"] == "medqa_usmle_4" and rec["splits"] == "test,train"
    assert rec["revision"] == _folder_revision(folder, list(folder.glob("*.jsonl")))
    first = items[0]
    assert first.source.split == "test" and first.source.source_id.startswith("sha256:")
    assert first.item_id == f"medqa4-test-{first.source.source_id.removeprefix('sha256:')}"
    assert first.metadata.exam_part == "step2&3"  # meta_info kept
    assert first.source.dataset == "medqa_usmle_4" and first.source.revision == rec["revision"]
    assert [o.label for o in first.options] == list("ABCD") and first.target_label == "B"
    assert first.target.role == "gold" and first.target.option_id == "src:1"
    assert "clarithromycin" in first.target.text
    assert [i for i in items if i.source.split == "train"][2].target.text == "Staphylococcus aureus"
    assert all(i.metadata.specialty is None and i.metadata.question_type is None for i in items)
    assert {i.metadata.exam_part for i in items} == {"step1", "step2&3"}


def test_medqa_ids_are_stable_when_a_copy_is_filtered_or_reordered(tmp_path):
    """Ids come from the row's content (MedQA rows have no id), not its row number."""
    lines = (FIX / "medqa4" / "phrases_no_exclude_test.jsonl").read_text().splitlines()
    full, _ = load(f"medqa4:{FIX / 'medqa4' / 'phrases_no_exclude_test.jsonl'}")
    copy = _write(tmp_path / "filtered_test.jsonl", "\n".join(reversed(lines[1:])) + "\n")
    part, _ = load(f"medqa4:{copy}")
    assert sorted(i.item_id for i in part) == sorted(i.item_id for i in full[1:])
    assert {i.item_id: i.question for i in part} == {i.item_id: i.question for i in full[1:]}
    # an explicit id wins, and an exact duplicate row gets a numbered id instead of stopping the build
    row = json.loads(lines[0])
    dup = _write(
        tmp_path / "dup_test.jsonl", "\n".join([lines[0], lines[0], json.dumps({**row, "id": "q7"})])
    )
    items, _ = load(f"medqa4:{dup}")
    assert [i.item_id for i in items] == [full[0].item_id, f"{full[0].item_id}~2", "medqa4-test-q7"]


def test_medqa5_original_layout_and_single_file():
    items, rec = load(f"medqa5:{FIX / 'medqa5' / 'US'}")
    assert rec["splits"] == "dev,test,train" and len(items) == 7
    assert all(len(i.options) == 5 for i in items)
    tests = [i for i in items if i.source.split == "test"]
    assert tests[1].target_label == "E"
    only, rec = load(f"medqa5:{FIX / 'medqa5' / 'US'}?splits=test")
    assert [i.item_id for i in only] == [i.item_id for i in tests]
    one_file = FIX / "medqa5" / "US" / "dev.jsonl"
    items, rec = load(f"medqa5:{one_file}")
    assert {i.source.split for i in items} == {"dev"} and rec["revision"] == content_revision(one_file)
    pinned, rec = load(f"medqa5:{one_file}@release-2021")
    assert rec["revision"] == "release-2021" == pinned[0].source.revision
    # a 4-option file is not a 5-option source
    with pytest.raises(SourceError, match=r"row 1: field 'options\.E'"):
        load(f"medqa5:{FIX / 'medqa4' / 'phrases_no_exclude_test.jsonl'}")


# ---------------------------------------------------------------------------------------------- MedMCQA
def test_medmcqa_hub_layout_uses_validation_not_the_unlabelled_test():
    items, rec = load(f"medmcqa:{FIX / 'medmcqa' / 'hub'}")
    assert rec["splits"] == "train,validation" and rec["cop_base"] == "0" and len(items) == 6
    by = _by_id(items)
    pah = by["medmcqa-5e0b6c1a-2f3d-4e5f-8a9b-0c1d2e3f4a01"]
    assert pah.target.text == "Phenylalanine hydroxylase" and pah.target_label == "B"
    assert pah.metadata.specialty == "Biochemistry" and pah.source.source_id.startswith("5e0b6c1a")
    assert by["medmcqa-9b8a7c6d-1e2f-4a3b-8c4d-5e6f7a8b9c03"].target.text == "Myocardium"
    with pytest.raises(SourceError, match=r"split test\]: row 1: field 'cop': no answer key.*validation"):
        load(f"medmcqa:{FIX / 'medmcqa' / 'hub'}?splits=test")


def test_medmcqa_original_release_is_one_based():
    items, rec = load(f"medmcqa:{FIX / 'medmcqa' / 'raw'}")
    assert rec["cop_base"] == "1" and rec["splits"] == "dev,train" and len(items) == 5
    by = {i.question.split()[0]: i for i in items}
    assert by["Koplik"].target.text == "Measles" and by["Koplik"].metadata.specialty == "Pediatrics"
    assert by["Drug"].target.text == "Ethosuximide"
    # read as 0-based, the 1-based key 4 is out of range: the error says so instead of shifting answers
    with pytest.raises(SourceError, match=r"train\.json: row 3: field 'cop': 4 is out of range 0\.\.3"):
        load(f"medmcqa:{FIX / 'medmcqa' / 'raw'}?cop_base=0")
    with pytest.raises(SourceError, match=r"test\.json: row 1: field 'cop'"):
        load(f"medmcqa:{FIX / 'medmcqa' / 'raw' / 'test.json'}")


# ---------------------------------------------------------------------------------------------- MedExQA
def test_medexqa_configs_per_specialty():
    items, rec = load(f"medexqa:{FIX / 'medexqa'}")
    assert rec["specialties"] == "biomedical_engineer,speech_pathologist" and len(items) == 10
    assert rec["splits"] == "dev,test"
    by = _by_id(items)
    it = by["medexqa-speech_pathologist-test-0002"]
    assert it.metadata.specialty == "Speech Language Pathology" and it.target.text == "Wernicke aphasia"
    assert by["medexqa-speech_pathologist-dev-0002"].question.startswith('A child says "wabbit"')
    sp, _ = load(f"medexqa:{FIX / 'medexqa'}?specialty=biomedical_engineer&splits=test")
    assert len(sp) == 3 and {i.metadata.specialty for i in sp} == {"Biomedical Engineering"}
    one, rec = load(f"medexqa:{FIX / 'medexqa' / 'dev' / 'speech_pathologist_dev.tsv'}")
    assert [i.item_id for i in one] == [
        "medexqa-speech_pathologist-dev-0001",
        "medexqa-speech_pathologist-dev-0002",
    ]
    assert rec["revision"] == content_revision(FIX / "medexqa" / "dev" / "speech_pathologist_dev.tsv")


def test_medexqa_release_folder_without_card(tmp_path):
    folder = tmp_path / "MedExQA"
    shutil.copytree(FIX / "medexqa", folder, ignore=shutil.ignore_patterns("README.md"))
    items, rec = load(f"medexqa:{folder}")
    hub_items, _ = load(f"medexqa:{FIX / 'medexqa'}")
    assert [i.model_dump(exclude={"source"}) for i in items] == [
        i.model_dump(exclude={"source"}) for i in hub_items
    ]
    assert rec["revision"] == _folder_revision(folder, list(folder.rglob("*.tsv")))


# ---------------------------------------------------------------------------------------------- PubMedQA
def test_pubmedqa_labeled_yes_no_maybe():
    items, rec = load(f"pubmedqa:{FIX / 'pubmedqa'}")
    assert rec["name"] == "pubmedqa" and rec["splits"] == "train" and len(items) == 4
    assert [(i.item_id, i.target.text) for i in items] == [
        ("pubmedqa-90000001", "yes"),
        ("pubmedqa-90000002", "no"),
        ("pubmedqa-90000003", "maybe"),
        ("pubmedqa-90000004", "yes"),
    ]
    first = items[0]
    assert [o.text for o in first.options] == ["yes", "no", "maybe"] and first.source.source_id == "90000001"
    assert first.question.startswith("BACKGROUND: Hypertension") and first.question.endswith(
        "Question: Does a daily walking programme lower resting blood pressure in older adults?"
    )
    bare, _ = load(f"pubmedqa:{FIX / 'pubmedqa'}?context=0")
    assert bare[0].question == "Does a daily walking programme lower resting blood pressure in older adults?"


def _official_pubmedqa(folder: Path) -> Path:
    """The Hub fixture's rows rewritten in the official ori_pqal.json shape (a JSON object keyed by
    PMID with QUESTION, CONTEXTS, LABELS, MESHES, YEAR, reasoning_*_pred, final_decision, LONG_ANSWER)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(FIX / "pubmedqa" / "pqa_labeled" / "train-00000-of-00001.parquet").to_pylist()
    data = {
        str(r["pubid"]): {
            "QUESTION": r["question"],
            "CONTEXTS": r["context"]["contexts"],
            "LABELS": r["context"]["labels"],
            "MESHES": r["context"]["meshes"],
            "YEAR": "2019",
            "reasoning_required_pred": "yes",
            "reasoning_free_pred": "yes",
            "final_decision": r["final_decision"],
            "LONG_ANSWER": r["long_answer"],
        }
        for r in rows
    }
    return _write(folder / "ori_pqal.json", json.dumps(data, indent=1))


def test_pubmedqa_official_ori_pqal_json_gives_the_hub_items(tmp_path):
    hub, _ = load(f"pubmedqa:{FIX / 'pubmedqa'}")
    path = _official_pubmedqa(tmp_path / "data")
    items, rec = load(f"pubmedqa:{path}")
    assert rec["layout"] == "official ori_pqal.json" and rec["revision"] == content_revision(path)
    strip = lambda it: it.model_dump(exclude={"source": {"revision"}})  # noqa: E731
    assert [strip(i) for i in items] == [strip(i) for i in hub]  # same ids, text, options, splits
    # with the split file next to it: its PMIDs are the test split, the rest train
    _write(tmp_path / "data" / "test_ground_truth.json", json.dumps({"90000002": "no", "90000004": "yes"}))
    items, rec = load(f"pubmedqa:{tmp_path / 'data'}")
    assert {i.item_id: i.source.split for i in items} == {
        "pubmedqa-90000001": "train",
        "pubmedqa-90000002": "test",
        "pubmedqa-90000003": "train",
        "pubmedqa-90000004": "test",
    }
    assert rec["layout"].endswith("test_ground_truth.json") and rec["splits"] == "test,train"
    only, _ = load(f"pubmedqa:{tmp_path / 'data'}?splits=test")
    assert [i.item_id for i in only] == ["pubmedqa-90000002", "pubmedqa-90000004"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d["90000003"].pop("QUESTION"), "row 3 (PMID 90000003): field 'QUESTION': missing"),
        (
            lambda d: d["90000001"].update(final_decision="perhaps"),
            "row 1 (PMID 90000001): field 'final_decision'",
        ),
        (
            lambda d: d["90000002"].update(LABELS=["A"]),
            "row 2 (PMID 90000002): field 'LABELS': 1 labels for 3",
        ),
    ],
)
def test_pubmedqa_official_bad_rows_name_the_field(tmp_path, damage, message):
    path = _official_pubmedqa(tmp_path)
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(SourceError, match=re.escape(message)):
        load(f"pubmedqa:{path}")


def test_pubmedqa_ground_truth_must_agree(tmp_path):
    _official_pubmedqa(tmp_path)
    _write(tmp_path / "test_ground_truth.json", json.dumps({"90000001": "no"}))
    with pytest.raises(SourceError, match=r"field 'final_decision': 'yes' but .* says 'no'"):
        load(f"pubmedqa:{tmp_path}")
    _write(tmp_path / "test_ground_truth.json", json.dumps({"123": "no"}))
    with pytest.raises(SourceError, match=re.escape("row 1: field 'PMID': 123 is not in ori_pqal.json")):
        load(f"pubmedqa:{tmp_path}")


# ---------------------------------------------------------------------------------------------- GMAI
def test_gmai_mmbench_val_tsv(tmp_path):
    tsv = FIX / "gmai_mmbench" / "GMAI_mm_bench_VAL.tsv"
    items, rec = load(f"gmai_mmbench:{tsv}?images={tmp_path / 'cache'}")
    assert rec["splits"] == "val" and len(items) == 4
    assert rec["skipped"] == "1" and rec["skipped_fewer_than_2_options"] == "1"  # row index 4: one option
    assert rec["image_root"] == str(tmp_path / "cache") and rec["revision"] == content_revision(tsv)
    by = _by_id(items)
    xray = by["gmai-val-1"]
    assert [o.label for o in xray.options] == list("ABCD") and xray.target.text == "Pleural effusion"
    assert xray.metadata.imaging_modality == "X-ray" and xray.metadata.specialty == "Pulmonary Medicine"
    png = (tmp_path / "cache" / xray.image).read_bytes()
    assert png.startswith(b"\x89PNG") and xray.image == f"images/{hashlib.sha256(png).hexdigest()}.png"
    assert len(by["gmai-val-2"].options) == 5 and by["gmai-val-2"].target_label == "E"
    # C is empty: A, B, D are shown as A, B, C and the answer D follows its option (identity src:3)
    grade = by["gmai-val-3"]
    assert [(o.label, o.option_id) for o in grade.options] == [("A", "src:0"), ("B", "src:1"), ("C", "src:3")]
    assert grade.target_label == "C" and grade.target.text == "Proliferative"
    # a folder holding VAL and TEST parts reads the VAL file unless told otherwise
    folder_items, _ = load(f"gmai_mmbench:{FIX / 'gmai_mmbench'}?images={tmp_path / 'cache'}")
    assert [i.item_id for i in folder_items] == [i.item_id for i in items]
    # the TEST parts have no answers
    with pytest.raises(SourceError, match=r"TEST_part_1\.tsv: row 1: field 'answer': column missing"):
        load(f"gmai_mmbench:{FIX / 'gmai_mmbench' / 'GMAI_mm_bench_TEST_part_1.tsv'}?images={tmp_path}")


def test_gmai_image_reference_and_bad_rows(tmp_path):
    lines = (FIX / "gmai_mmbench" / "GMAI_mm_bench_VAL.tsv").read_text(encoding="utf-8").splitlines()
    header, row1 = lines[0], lines[1].split("\t")
    ref = [*row1[:-1], "1"]  # MMBench convention: an image cell naming another row's index
    ref[0] = "9"
    ok = _write(tmp_path / "ok_val.tsv", "\n".join([header, lines[1], "\t".join(ref)]) + "\n")
    items, _ = load(f"gmai_mmbench:{ok}?images={tmp_path / 'c'}")
    assert items[1].image == items[0].image
    bad_answer = [*row1]
    bad_answer[7] = "E"  # column 'answer'; E is empty in this row
    f = _write(tmp_path / "a_val.tsv", "\n".join([header, lines[1], "\t".join(bad_answer)]) + "\n")
    with pytest.raises(SourceError, match=rf"{f.name}: row 2: field 'answer': answer 'E' is not among"):
        load(f"gmai_mmbench:{f}?images={tmp_path / 'c'}")
    bad_image = [*row1[:-1], "not*base64"]
    f = _write(tmp_path / "b_val.tsv", "\n".join([header, "\t".join(bad_image)]) + "\n")
    with pytest.raises(SourceError, match=rf"{f.name}: row 1: field 'image': not valid base64"):
        load(f"gmai_mmbench:{f}?images={tmp_path / 'c'}")
    not_image = [*row1[:-1], base64.b64encode(b"plain text").decode()]
    f = _write(tmp_path / "c_val.tsv", "\n".join([header, "\t".join(not_image)]) + "\n")
    with pytest.raises(SourceError, match=r"row 1: field 'image': decoded bytes are not"):
        load(f"gmai_mmbench:{f}?images={tmp_path / 'c'}")


# ---------------------------------------------------------------------------------------------- generic
def test_generic_csv_with_split_column():
    spec = f"generic:{FIX / 'generic' / 'questions.csv'}?mapping={FIX / 'generic' / 'mapping.yaml'}"
    items, rec = load(spec)
    assert rec["name"] == "demo_mcqa" and rec["splits"] == "test,train" and len(items) == 5
    by = _by_id(items)
    assert by["demo_mcqa-g-001"].target.text == "Squamous cell carcinoma"
    assert by["demo_mcqa-g-001"].metadata.question_type == "diagnosis"
    assert (
        by["demo_mcqa-g-005"].source.split == "train"
        and by["demo_mcqa-g-005"].metadata.specialty == "Surgery"
    )
    test_only, _ = load(spec + "&splits=test")
    assert {i.source.split for i in test_only} == {"test"} and len(test_only) == 3


def test_generic_options_column_and_answer_formats(tmp_path):
    rows = [
        {
            "q": "Which vessel carries oxygenated blood from the lungs to the heart?",
            "choices": {"A": "Pulmonary vein", "B": "Pulmonary artery", "C": "Vena cava"},
            "key": "A",
        },
        {
            "q": "Which hormone lowers blood glucose?",
            "choices": {"A": "Glucagon", "B": "Insulin"},
            "key": "B",
        },
    ]
    data = _write(tmp_path / "test.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    mapping = _write(
        tmp_path / "m.json",
        json.dumps(
            {
                "name": "tiny",
                "question": "q",
                "options_column": "choices",
                "answer": "key",
                "answer_format": "letter",
            }
        ),
    )
    items, _ = load(f"generic:{data}?mapping={mapping}")
    assert [i.item_id for i in items] == ["tiny-test-000001", "tiny-test-000002"]
    assert items[0].target.text == "Pulmonary vein" and len(items[1].options) == 2
    as_text = _write(
        tmp_path / "m2.yaml",
        "name: tiny\nquestion: q\noptions_column: choices\nanswer: q\nanswer_format: text\n",
    )
    with pytest.raises(SourceError, match=r"test\.jsonl: row 1: field 'q': answer text .* matches 0 options"):
        load(f"generic:{data}?mapping={as_text}")
    broken = _write(tmp_path / "m3.yaml", "name: tiny\nquestion: q\nanswer: key\nanswer_format: letter\n")
    with pytest.raises(SourceError, match=r"m3\.yaml: field '<mapping>'|m3\.yaml: .*exactly one of"):
        load(f"generic:{data}?mapping={broken}")


# ------------------------------------------------------------------------------------------ malformed rows
def test_malformed_jsonl_rows(tmp_path):
    good = (FIX / "medqa4" / "phrases_no_exclude_test.jsonl").read_text(encoding="utf-8").splitlines()
    row2 = json.loads(good[1])
    f = _write(
        tmp_path / "bad_letter_test.jsonl",
        "\n".join([good[0], json.dumps({**row2, "answer_idx": "F"})]) + "\n",
    )
    with pytest.raises(SourceError, match=rf"{f.name}: row 2: field 'answer_idx': answer 'F' is not among"):
        load(f"medqa4:{f}")
    f = _write(tmp_path / "json_test.jsonl", "\n".join([good[0], good[1][:-20], good[2]]) + "\n")
    with pytest.raises(SourceError, match=rf"{f.name}: row 2 \(line 2\): field '<json>': not valid JSON"):
        load(f"medqa4:{f}")
    no_col = [json.loads(x) for x in good]
    for r in no_col:
        del r["answer_idx"]
    f = _write(tmp_path / "nocol_test.jsonl", "".join(json.dumps(r) + "\n" for r in no_col))
    with pytest.raises(SourceError, match=rf"{f.name}: row 1: field 'answer_idx': column missing"):
        load(f"medqa4:{f}")
    empty_q = [json.loads(x) for x in good]
    empty_q[2]["question"] = "   "
    f = _write(tmp_path / "q_test.jsonl", "".join(json.dumps(r) + "\n" for r in empty_q))
    with pytest.raises(SourceError, match=rf"{f.name}: row 3: field 'question': empty"):
        load(f"medqa4:{f}")
    wrong_text = [json.loads(x) for x in good]
    wrong_text[0]["answer"] = "Something else"
    f = _write(tmp_path / "t_test.jsonl", "".join(json.dumps(r) + "\n" for r in wrong_text))
    with pytest.raises(SourceError, match=rf"{f.name}: row 1: field 'answer': answer text"):
        load(f"medqa4:{f}")
    # skip-and-count instead of raising, never silent
    items, rec = load(f"medqa4:{f}?bad_rows=skip")
    assert (
        len(items) == 2
        and rec["skipped_bad_rows"] == "1"
        and "row 1: field 'answer'" in rec["skipped_bad_rows_examples"]
    )


def test_malformed_tsv_rows(tmp_path):
    good = (
        (FIX / "medexqa" / "test" / "biomedical_engineer_test.tsv").read_text(encoding="utf-8").splitlines()
    )
    cells = good[1].split("\t")
    f = _write(
        tmp_path / "biomedical_engineer_test.tsv", "\n".join([good[0], "\t".join([*cells[:7], "E"])]) + "\n"
    )
    with pytest.raises(SourceError, match=rf"{f.name}: row 2: field 'answer': answer 'E' is not among"):
        load(f"medexqa:{f}")
    f = _write(tmp_path / "x" / "biomedical_engineer_test.tsv", "\t".join(["", *cells[1:]]) + "\n")
    with pytest.raises(SourceError, match=rf"{f.name}: row 1: field 'question': missing"):
        load(f"medexqa:{f}")
    f = _write(
        tmp_path / "y" / "biomedical_engineer_test.tsv", "\t".join([*cells[:3], "", *cells[4:]]) + "\n"
    )
    with pytest.raises(SourceError, match=rf"{f.name}: row 1: field 'C': missing or empty option"):
        load(f"medexqa:{f}")


def test_malformed_parquet_rows_and_duplicate_ids(tmp_path):
    import datasets

    src = datasets.load_dataset(str(FIX / "medmcqa" / "hub"), split="validation")
    rows = src.to_list()
    rows[1]["cop"] = 3
    rows[2]["opd"] = ""
    f = tmp_path / "validation-00000-of-00001.parquet"
    datasets.Dataset.from_list(rows, features=src.features).to_parquet(str(f))
    with pytest.raises(SourceError, match=rf"{f.name}: row 3: field 'opd': missing or empty option"):
        load(f"medmcqa:{f}")
    rows[2]["opd"] = "Soleus"
    rows[2]["id"] = rows[0]["id"]
    datasets.Dataset.from_list(rows, features=src.features).to_parquet(str(f))
    with pytest.raises(SourceError, match=r"row 3: field 'id': duplicate item id"):
        load(f"medmcqa:{f}")
    rows[2]["id"] = "fresh-id"
    del rows[0]["subject_name"]
    plain = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "cop"} for r in rows])
    plain.to_parquet(str(f))
    with pytest.raises(SourceError, match=rf"{f.name}: row 1: field 'cop': column missing"):
        load(f"medmcqa:{f}")


def test_malformed_csv_rows(tmp_path):
    text = (
        (FIX / "generic" / "questions.csv").read_text(encoding="utf-8").replace(",2,Surgery,", ",5,Surgery,")
    )
    f = _write(tmp_path / "questions.csv", text)
    with pytest.raises(
        SourceError, match=rf"{f.name} \(partition=train\): row 2: field 'correct': index 5 is out"
    ):
        load(f"generic:{f}?mapping={FIX / 'generic' / 'mapping.yaml'}")


# ---------------------------------------------------------------------------------------------- building
def test_build_suite_from_an_adapter(tmp_path):

    from equipoise.builders.mcq_build import build_mcq_suite
    from equipoise.builders.suites import SuiteOptions, clear, nota

    out = tmp_path / "c"
    manifest = build_mcq_suite("clear", out, source=f"medqa5:{FIX / 'medqa5' / 'US'}")
    assert manifest["source"]["name"] == "medqa_usmle_5" and manifest["source"]["revision"].startswith(
        "sha256:"
    )
    assert manifest["configs"]["k1_gold"]["rows"] == 3 and manifest["configs"]["k4_na"]["rows"] == 3
    ds = load_local(out, "k4_gold")  # a cache per build: datasets keys local folders by basename
    test_ids = [i.item_id for i in load(f"medqa5:{FIX / 'medqa5' / 'US'}?splits=test")[0]]
    assert sorted(ds["base_id"]) == sorted(test_ids) and len(test_ids) == 3
    # MedMCQA is evaluated on its validation split (the test split has no key)
    items, _ = load(f"medmcqa:{FIX / 'medmcqa' / 'hub'}")
    res = clear(items, SuiteOptions(eval_split="validation", max_k=2))
    assert {len(v) for v in res.configs.values()} == {3}
    res = nota(items, SuiteOptions(eval_split="validation"))
    assert [r.target.role for r in res.configs["minus_correct_plus_nota"]] == ["nota"] * 3


# ---------------------------------------------------------------------------------------------- Hub path
def _hub_child(report: str) -> None:
    """Runs with HF_ENDPOINT at tests/fakehub.py: publish fixtures as Hub repos, read them back by repo id."""
    from huggingface_hub import HfApi

    api = HfApi()
    out: dict = {}
    for repo, folder in (
        ("org/medmcqa", "medmcqa/hub"),
        ("org/medexqa", "medexqa"),
        ("org/gmai", "gmai_mmbench"),
    ):
        api.create_repo(repo, repo_type="dataset")
        out[repo] = api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=str(FIX / folder)).oid
    api.create_tag("org/medmcqa", tag="v1", repo_type="dataset")
    for spec in (
        "medmcqa:org/medmcqa",
        "medmcqa:org/medmcqa@v1",
        "medexqa:org/medexqa?specialty=speech_pathologist",
        f"gmai_mmbench:org/gmai?images={Path(report).parent / 'img'}",
    ):
        items, rec = load(spec)
        out[spec] = {
            "rec": rec,
            "ids": [i.item_id for i in items],
            "rev": sorted({i.source.revision for i in items}),
        }
    Path(report).write_text(json.dumps(out), encoding="utf-8")


def test_hub_repo_ids_go_through_the_same_path(tmp_path):
    from tests.fakehub import FakeHub, client_env

    report = tmp_path / "report.json"
    with FakeHub(tmp_path / "server") as hub:
        env = client_env(hub, tmp_path / "hf", "hf_test")
        code = f"from tests.test_adapters import _hub_child; _hub_child({str(report)!r})"
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(report.read_text(encoding="utf-8"))
    commit = out["org/medmcqa"]
    assert out["medmcqa:org/medmcqa"]["rec"]["revision"] == commit  # the resolved commit is recorded
    assert out["medmcqa:org/medmcqa"]["rev"] == [commit] and len(out["medmcqa:org/medmcqa"]["ids"]) == 6
    tagged = out["medmcqa:org/medmcqa@v1"]["rec"]
    assert tagged["revision"] == "v1" and tagged["commit"] == commit
    assert (
        out["medexqa:org/medexqa?specialty=speech_pathologist"]["ids"][0]
        == "medexqa-speech_pathologist-dev-0001"
    )
    gmai = next(v for k, v in out.items() if k.startswith("gmai_mmbench:"))
    assert gmai["rec"]["revision"] == out["org/gmai"] and gmai["ids"] == [
        f"gmai-val-{n}" for n in (1, 2, 3, 5)
    ]


def test_fixture_generator_is_in_sync(tmp_path):
    """The committed Parquet/TSV fixtures are what make_fixtures.py writes (rows, not bytes)."""
    import datasets

    sys.path.insert(0, str(FIX))
    try:
        import make_fixtures
    finally:
        sys.path.remove(str(FIX))
    got = datasets.load_dataset(str(FIX / "pubmedqa"), "pqa_labeled", split="train").to_list()
    assert got == make_fixtures.PUBMEDQA
    got = datasets.load_dataset(str(FIX / "medmcqa" / "hub"), split="train").to_list()
    assert got == make_fixtures.MEDMCQA["train"]
    copy = tmp_path / "g.tsv"
    make_fixtures.write_tsv(copy, make_fixtures.GMAI_COLUMNS, make_fixtures.GMAI_VAL)
    assert copy.read_bytes() == (FIX / "gmai_mmbench" / "GMAI_mm_bench_VAL.tsv").read_bytes()
