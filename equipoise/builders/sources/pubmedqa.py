"""PubMedQA (pqa_labeled): yes / no / maybe questions over an abstract's context; the Hub's Parquet
layout and the official release's ``ori_pqal.json`` (+ ``test_ground_truth.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from equipoise.builders.sources.base import (
    Collector,
    Ctx,
    RowError,
    SourceKind,
    SourceSpec,
    make_item,
    open_location,
    opt_text,
    register,
    require_columns,
    sha256_files,
    text_field,
)
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import MCQItem

PUBMEDQA_DECISIONS = ("yes", "no", "maybe")


# ---------------------------------------------------------------------------------------------
# PubMedQA: qiaojin/PubMedQA config pqa_labeled (yes / no / maybe; one 'train' split of 1000 rows).
# Checked against the dataset_info of its Parquet export (pubid int32, question, context sequence of
# {contexts, labels, meshes, reasoning_required_pred, reasoning_free_pred}, long_answer, final_decision).
# ---------------------------------------------------------------------------------------------
def pubmedqa_row(row: dict[str, Any], ctx: Ctx, with_context: bool) -> MCQItem:
    """{pubid, question, context {contexts, labels, meshes}, long_answer, final_decision} -> item."""
    pubid = text_field(row, "pubid")
    question = text_field(row, "question")
    decision = opt_text(row.get("final_decision"))
    if decision is None:
        raise RowError("final_decision", "missing answer")
    if decision.lower() not in PUBMEDQA_DECISIONS:
        raise RowError("final_decision", f"{decision!r} is not one of {list(PUBMEDQA_DECISIONS)}")
    text = question
    if with_context:
        context = row.get("context")
        if not isinstance(context, dict):
            raise RowError("context", "missing (expected {contexts, labels, meshes})")
        contexts = context.get("contexts") or []
        labels = context.get("labels") or []
        if not contexts or not all(isinstance(c, str) and c.strip() for c in contexts):
            raise RowError("context.contexts", "missing or empty context passages")
        if labels and len(labels) != len(contexts):
            raise RowError("context.labels", f"{len(labels)} labels for {len(contexts)} contexts")
        lines = [
            f"{lab}: {c.strip()}" if lab else c.strip()
            for lab, c in zip(labels or [None] * len(contexts), contexts, strict=True)
        ]
        text = "\n".join(lines) + f"\n\nQuestion: {question}"
    return make_item(
        ctx,
        item_id=f"{ctx.prefix}-{pubid}",
        source_id=pubid,
        question=text,
        options=list(enumerate(PUBMEDQA_DECISIONS)),
        gold=PUBMEDQA_DECISIONS.index(decision.lower()),
    )


# ---------------------------------------------------------------------------------------------
# The official release (pubmedqa/pubmedqa, data/ori_pqal.json): a JSON object keyed by PMID, each
# {QUESTION, CONTEXTS, LABELS, MESHES, YEAR, reasoning_required_pred, reasoning_free_pred,
# final_decision, LONG_ANSWER}; data/test_ground_truth.json maps the 500 test PMIDs to their
# decision.  With that file next to it, those PMIDs are the 'test' split and the rest 'train';
# without it every item is 'train' (as in the Hub's pqa_labeled).  Items get the same ids and text as
# from the Hub layout, so the two copies are interchangeable.
# ---------------------------------------------------------------------------------------------
OFFICIAL_FILE = "ori_pqal.json"
GROUND_TRUTH_FILE = "test_ground_truth.json"
OFFICIAL_FIELDS = {
    "question": "QUESTION",
    "context": "CONTEXTS",
    "context.contexts": "CONTEXTS",
    "context.labels": "LABELS",
    "final_decision": "final_decision",
}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text ({exc.reason})") from exc


def _official(loc: Path) -> tuple[Path, Path | None] | None:
    """(ori_pqal.json, test_ground_truth.json or None) when ``loc`` is the official layout."""
    if loc.is_dir():
        for folder in (loc, loc / "data"):
            if (folder / OFFICIAL_FILE).is_file():
                gt = folder / GROUND_TRUTH_FILE
                return folder / OFFICIAL_FILE, gt if gt.is_file() else None
        return None
    if loc.is_file() and loc.suffix.lower() == ".json" and (loc.name == OFFICIAL_FILE or _keyed_by_pmid(loc)):
        gt = loc.parent / GROUND_TRUTH_FILE
        return loc, gt if gt.is_file() and gt != loc else None
    return None


def _keyed_by_pmid(path: Path) -> bool:
    """Whether a .json file is one object of PMID -> {QUESTION, ...} (renamed copies of ori_pqal)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False  # JSON lines, or not JSON: left to the datasets reader and its errors
    return isinstance(raw, dict) and any(isinstance(v, dict) and "QUESTION" in v for v in raw.values())


def _load_official(
    spec: SourceSpec, data: Path, truth: Path | None, with_context: bool
) -> tuple[list[MCQItem], dict[str, str]]:
    raw = _read_json(data)
    if not isinstance(raw, dict):
        raise SourceError(f"{data}: expected a JSON object keyed by PMID, got a JSON {type(raw).__name__}")
    gt: dict[str, str] = {}
    if truth is not None:
        gt_raw = _read_json(truth)
        if not isinstance(gt_raw, dict):
            raise SourceError(f"{truth}: expected a JSON object of PMID -> decision")
        for n, (pmid, decision) in enumerate(gt_raw.items(), start=1):
            if str(decision).lower() not in PUBMEDQA_DECISIONS:
                raise SourceError(
                    f"{truth}: row {n} (PMID {pmid}): field 'decision': {decision!r} is not yes/no/maybe"
                )
            if pmid not in raw:
                raise SourceError(f"{truth}: row {n}: field 'PMID': {pmid} is not in {data.name}")
            gt[pmid] = str(decision).lower()
    files = [data, *([truth] if truth else [])]
    revision = spec.revision or sha256_files(files, None if len(files) == 1 else data.parent)
    wanted = spec.list_param("splits")
    skip = spec.params.get("bad_rows", "raise") == "skip"
    bad: list[str] = []
    items: list[MCQItem] = []
    for n, (pmid, rec) in enumerate(raw.items(), start=1):
        split = "test" if pmid in gt else "train"
        where = f"{data}: row {n} (PMID {pmid})"
        if not isinstance(rec, dict):
            raise SourceError(f"{where}: field '<row>': expected an object, got {type(rec).__name__}")
        row = {
            "pubid": pmid,
            "question": rec.get("QUESTION"),
            "context": {
                "contexts": rec.get("CONTEXTS"),
                "labels": rec.get("LABELS"),
                "meshes": rec.get("MESHES"),
            },
            "final_decision": rec.get("final_decision"),
            "long_answer": rec.get("LONG_ANSWER"),
        }
        ctx = Ctx(dataset="pubmedqa", prefix="pubmedqa", split=split, revision=revision, n=n)
        try:
            item = pubmedqa_row(row, ctx, with_context)
        except RowError as exc:
            message = f"{where}: field '{OFFICIAL_FIELDS.get(exc.field, exc.field)}': {exc.message}"
            if not skip:
                raise SourceError(message) from exc
            bad.append(message)
            continue
        if pmid in gt and gt[pmid] != item.target.text:
            raise SourceError(
                f"{where}: field 'final_decision': {item.target.text!r} but {truth} says {gt[pmid]!r}"
            )
        if not wanted or split in wanted:
            items.append(item)
    record = {
        "name": "pubmedqa",
        "revision": revision,
        "kind": "pubmedqa",
        "location": spec.location,
        "layout": "official ori_pqal.json" + (f" + {GROUND_TRUTH_FILE}" if truth else ""),
        "splits": ",".join(sorted({i.source.split for i in items})),
        "items": str(len(items)),
        "skipped": str(len(bad)),
        "context": str(int(with_context)),
    }
    if bad:
        record["skipped_bad_rows"] = str(len(bad))
        record["skipped_bad_rows_examples"] = " | ".join(bad[:5])
    return items, record


def _load_pubmedqa(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    config = spec.params.get("config", "pqa_labeled")
    with_context = spec.params.get("context", "1") not in ("0", "false", "no")
    official = _official(Path(spec.location).expanduser())
    if official is not None:
        return _load_official(spec, *official, with_context)
    opened = open_location(spec, config=config, data_glob="*.parquet")
    name = "pubmedqa" if config == "pqa_labeled" else f"pubmedqa_{config}"
    col = Collector(spec)
    for part in opened.parts:
        require_columns(part, ["pubid", "question", "final_decision", *(["context"] if with_context else [])])
        ctx = Ctx(dataset=name, prefix=name, split=part.split, revision=opened.revision)
        col.run(part, ctx, lambda r, c: pubmedqa_row(r, c, with_context))
    return col.items, col.record(
        name, opened.revision, spec, config=config, context=str(int(with_context)), **opened.notes
    )


register(SourceKind("pubmedqa", _load_pubmedqa, frozenset({"context"}), summary="PubMedQA"))
