"""Validate a built or published dataset folder: hashes, schemas, labels, leakage.

Checks, in order, each reported with the file it concerns:
1. every file listed in ``manifest.json`` exists and has the recorded sha256 (tampering, truncation);
2. each config's rows load as a frame that passes a pandera schema (columns, types, uniqueness,
   label validity), then re-validate as the suite's pydantic record, naming file and row;
3. row counts equal the manifest's;
4. suite-specific: ClinDet labels are re-proved by the engine; MCQ few-shot pools share no base item
   and no question text with the evaluation configs, nor does a config's calibration ``validation``
   split with the test or pool rows (leakage).

Images (VQA suites) are files of the dataset like the Parquet configs: check 1 covers a missing or
altered image; in addition a file under ``images/`` that the manifest does not list is reported (it
would be published nowhere and hide a mismatch), every listed image must be named by its own sha256
(content address), and every ``image`` an MCQ row names must be a listed file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pandera.pandas as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from equipoise.builders.dataset_writer import verify_dataset
from equipoise.builders.publish import EXTERNAL_IMAGE, IMAGE_DIR, IMAGE_RE
from equipoise.schemas.clindet import DeterminabilityCase
from equipoise.schemas.items import MCQItem


@dataclass
class ValidationReport:
    folder: Path
    suite: str = "?"
    rows: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


_LABEL = r"^[A-Z]$"

MCQ_FRAME = pa.DataFrameSchema(
    {
        "item_id": pa.Column(str, unique=True),
        "base_id": pa.Column(str),
        "variant": pa.Column(str),
        "question": pa.Column(str, pa.Check.str_length(min_value=1)),
        "target_label": pa.Column(str, pa.Check.str_matches(_LABEL)),
        "n_options": pa.Column(int, pa.Check.in_range(2, 26)),
        "target_in_options": pa.Column(bool, pa.Check.eq(True)),
        "labels_in_order": pa.Column(bool, pa.Check.eq(True)),
        "max_framing_repeats": pa.Column(int, pa.Check.le(1)),
        "n_provenance": pa.Column(int, pa.Check.ge(0)),
    },
    strict=True,
    coerce=False,
)

CASE_FRAME = pa.DataFrameSchema(
    {
        "case_id": pa.Column(str, unique=True),
        "system_id": pa.Column(str),
        "criterion_id": pa.Column(str),
        "condition": pa.Column(
            str, pa.Check.isin(["complete", "incomplete_determinable", "incomplete_undeterminable"])
        ),
        "label": pa.Column(str, pa.Check.isin(["Met", "Not met", "Unable to determine"])),
        "s_min": pa.Column(float),
        "s_max": pa.Column(float),
        "range_ok": pa.Column(bool, pa.Check.eq(True)),
    },
    strict=True,
)


def _mcq_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "item_id": [r["item_id"] for r in rows],
            "base_id": [r["base_id"] for r in rows],
            "variant": [r["variant"] for r in rows],
            "question": [r["question"] for r in rows],
            "target_label": [r["target_label"] for r in rows],
            "n_options": [len(r["options"]) for r in rows],
            "target_in_options": [r["target_label"] in [o["label"] for o in r["options"]] for r in rows],
            "labels_in_order": [
                [o["label"] for o in r["options"]] == [chr(65 + i) for i in range(len(r["options"]))]
                for r in rows
            ],
            "max_framing_repeats": [
                max(
                    [
                        sum(o["framing"] == f for o in r["options"])
                        for f in {o["framing"] for o in r["options"] if o["framing"]}
                    ]
                    or [0]
                )
                for r in rows
            ],
            "n_provenance": [len(r["provenance"]) for r in rows],
        }
    )


def _case_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            k: [r[k] for r in rows]
            for k in ("case_id", "system_id", "criterion_id", "condition", "label", "s_min", "s_max")
        }
    )
    df["range_ok"] = df["s_min"] <= df["s_max"]
    return df


def _dangling_images(path: Path, items: list[MCQItem], listed: dict[str, str]) -> list[str]:
    """Rows whose ``image`` is not a file of this dataset (a reader would find nothing there); the
    first few per config, plus a count."""
    bad = [
        f"{path}: row {i} ({it.item_id}): image {it.image!r} is not a file listed in manifest.json"
        for i, it in enumerate(items)
        if it.image and not it.image.startswith(EXTERNAL_IMAGE) and it.image not in listed
    ]
    if len(bad) > 5:
        return [*bad[:5], f"{path}: {len(bad) - 5} more row(s) name images the dataset does not hold"]
    return bad


def norm_question(q: str) -> str:
    return re.sub(r"\W+", " ", q.lower()).strip()


def source_question(item: MCQItem) -> str:
    """The question as it was before any edit (normalised): what leakage must compare."""
    original = next((s.original_question for s in item.provenance if s.original_question), None)
    return norm_question(original or item.question)


def _split_leakage(
    folder: Path, manifest: dict, loaded: dict[str, list], evals: list[str], pools: list[str]
) -> list[str]:
    """Rows of a config's own extra split (the calibration 'validation' split) that are also an
    evaluated (test) or pool item, by base id or by source question: a calibration set that contains
    evaluated items would make conformal coverage look better than it is."""
    other = [i for n in (*evals, *pools) for i in loaded.get(n, [])]
    ids = {i.base_id for i in other}
    questions = {source_question(i) for i in other}
    problems = []
    for key, rows in loaded.items():
        if "/" not in key:
            continue
        name, split = key.split("/", 1)
        path = folder / manifest["configs"][name]["splits"][split]["path"]
        bad = [it for it in rows if it.base_id in ids or source_question(it) in questions]
        problems += [
            f"{path}: {split} item {it.item_id} leaks into the test or pool configs" for it in bad[:5]
        ]
        if len(bad) > 5:
            problems.append(f"{path}: {len(bad) - 5} more {split} item(s) leak")
    return problems


def image_file_problems(folder: Path, listed: dict[str, str]) -> list[str]:
    """Unlisted files under ``images/`` and listed images not named by their sha256, each naming the file."""
    problems = []
    image_dir = folder / IMAGE_DIR
    if image_dir.is_dir():
        for p in sorted(image_dir.rglob("*")):
            rel = p.relative_to(folder).as_posix()
            if p.is_file() and rel not in listed:
                problems.append(f"{p}: image file not listed in manifest.json (extra file)")
    for rel, digest in listed.items():
        if rel.startswith(f"{IMAGE_DIR}/"):
            m = IMAGE_RE.fullmatch(rel)
            if m is None or m.group(1) != digest:
                problems.append(f"{folder / rel}: image is not named images/<its sha256>.<ext>")
    return problems


def validate_folder(folder: Path, reprove: bool = True) -> ValidationReport:
    rep = ValidationReport(folder)
    rep.problems.extend(verify_dataset(folder))
    try:  # read even when a hash failed, so an unlisted image is named alongside
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # bad JSON or bad UTF-8
        return rep  # verify_dataset has reported it
    if not isinstance(manifest, dict):
        return rep  # likewise
    listed: dict[str, str] = manifest.get("files", {})
    rep.problems.extend(image_file_problems(folder, listed))
    if rep.problems:
        return rep
    rep.checks.append("sha256 of every file matches the manifest")
    if any(rel.startswith(f"{IMAGE_DIR}/") for rel in listed):
        rep.checks.append("images/ holds exactly the listed images, each named by its sha256")
    rep.suite = manifest.get("suite", "?")
    model = DeterminabilityCase if rep.suite == "clindet" else MCQItem
    loaded: dict[str, list] = {}
    # every file with rows: (config, split, its manifest entry); own extra splits (a calibration
    # 'validation' split) are checked like the test file, and keyed 'CONFIG/SPLIT' in ``loaded``
    entries = [
        (name, split, sinfo)
        for name, info in manifest["configs"].items()
        for split, sinfo in [("test", info), *sorted((info.get("splits") or {}).items())]
    ]
    for name, split, info in entries:
        key = name if split == "test" else f"{name}/{split}"
        path = folder / info["path"]
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for corrupt files
            rep.problems.append(f"{path}: unreadable Parquet ({exc})")
            continue
        rep.rows[key] = len(rows)
        if len(rows) != info["rows"]:
            rep.problems.append(f"{path}: {len(rows)} rows, manifest says {info['rows']}")
        if name in ("explanation", "prompts"):
            continue
        if not rows and model is MCQItem:  # say so; the frame check would trip over all-null types
            rep.problems.append(
                f"{path}: config '{name}' split '{split}' has 0 rows (an empty config is never published)"
                if split != "test"
                else f"{path}: config '{name}' has 0 rows (an empty config is never published)"
            )
            continue
        frame = _case_frame(rows) if model is DeterminabilityCase else _mcq_frame(rows)
        try:
            (CASE_FRAME if model is DeterminabilityCase else MCQ_FRAME).validate(frame, lazy=True)
        except pa.errors.SchemaErrors as exc:
            fc = exc.failure_cases.head(3).to_dict("records")
            rep.problems.append(f"{path}: frame check failed: {fc}")
            continue
        objs = []
        for i, r in enumerate(rows):
            try:
                objs.append(model.model_validate(r))
            except ValidationError as exc:
                e = exc.errors()[0]
                rep.problems.append(f"{path}: row {i}: field '{'.'.join(map(str, e['loc']))}': {e['msg']}")
                break
        loaded[key] = objs
        if model is MCQItem:
            rep.problems.extend(_dangling_images(path, objs, listed))
    if rep.problems:
        return rep
    rep.checks.append("every config passes its pandera frame schema and re-validates row by row")
    if model is MCQItem and any(i.image for rows in loaded.values() for i in rows):
        rep.checks.append("every image an item names is a listed file of the dataset")
    if model is DeterminabilityCase and reprove:
        from equipoise.scoring_systems.engine import evaluate
        from equipoise.scoring_systems.loader import get_system

        bad = 0
        for c in loaded.get("all", []):
            ev = evaluate(get_system(c.system_id), c.findings)
            if ev.label(c.criterion_id) != c.label or (ev.s_min, ev.s_max) != (c.s_min, c.s_max):
                bad += 1
                rep.problems.append(
                    f"{c.case_id}: stored {c.label!r}, engine says {ev.label(c.criterion_id)!r}"
                )
        if not bad:
            rep.checks.append(f"every label re-proved by the engine ({len(loaded.get('all', []))} cases)")
    if model is MCQItem:
        pools = manifest.get("pool_configs") or []
        evals = manifest.get("eval_configs") or [n for n in loaded if n not in pools and "/" not in n]
        eval_ids = {i.base_id for n in evals for i in loaded.get(n, [])}
        eval_q = {source_question(i) for n in evals for i in loaded.get(n, [])}
        for p in pools:
            for it in loaded.get(p, []):
                if it.base_id in eval_ids or source_question(it) in eval_q:
                    rep.problems.append(
                        f"{folder / manifest['configs'][p]['path']}: pool item {it.item_id} leaks into "
                        f"evaluation configs"
                    )
        if pools and not rep.problems:
            rep.checks.append(f"no leakage between pools {pools} and evaluation configs")
        rep.problems.extend(_split_leakage(folder, manifest, loaded, evals, pools))
        extra = [k for k in loaded if "/" in k]
        if extra and not rep.problems:
            rep.checks.append(f"no leakage between {', '.join(extra)} and the test or pool rows")
    return rep
