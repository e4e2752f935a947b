"""MedMCQA: the Hub Parquet copy (cop 0-3) and the original JSON-lines release (cop 1-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from equipoise.builders.sources.base import (
    Collector,
    Ctx,
    RowError,
    SourceKind,
    SourceSpec,
    has_configs,
    make_item,
    open_location,
    opt_text,
    register,
    require_columns,
    text_field,
)
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import ItemMetadata, MCQItem

# ---------------------------------------------------------------------------------------------
# MedMCQA: openlifescienceai/medmcqa (cop 0-3, test -1) and the original release (cop 1-4).
# Checked against the HF loading script that produced the Hub data (reads train.json / dev.json /
# test.json as JSON lines, cop = int(cop) - 1, -1 when the test row has none; ClassLabel a-d) and the
# card's field list; the card's "cop: 1,2,3,4" describes the raw files (medmcqa/medmcqa issue #9).
# ---------------------------------------------------------------------------------------------
MEDMCQA_OPTIONS = ("opa", "opb", "opc", "opd")


def medmcqa_row(row: dict[str, Any], ctx: Ctx, cop_base: int) -> MCQItem:
    """{id, question, opa..opd, cop, choice_type, exp, subject_name, topic_name} -> item."""
    source_id = text_field(row, "id")
    question = text_field(row, "question")
    options = []
    for i, key in enumerate(MEDMCQA_OPTIONS):
        text = opt_text(row.get(key))
        if text is None:
            raise RowError(key, "missing or empty option")
        options.append((i, text))
    cop = row.get("cop")
    if cop is None or cop == -1:
        raise RowError(
            "cop", "no answer key (MedMCQA's public test split is unlabelled; evaluate on validation)"
        )
    if isinstance(cop, str) and cop.strip().lstrip("-").isdigit():
        cop = int(cop)
    if isinstance(cop, bool) or not isinstance(cop, int):
        raise RowError("cop", f"expected an integer, got {cop!r}")
    gold = cop - cop_base
    if not 0 <= gold < 4:
        raise RowError("cop", f"{cop} is out of range {cop_base}..{cop_base + 3} (cop_base={cop_base})")
    return make_item(
        ctx,
        item_id=f"medmcqa-{source_id}",
        source_id=source_id,
        question=question,
        options=options,
        gold=gold,
        metadata=ItemMetadata(specialty=opt_text(row.get("subject_name"))),
    )


def _load_medmcqa(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    loc = Path(spec.location)
    raw_release = loc.exists() and (
        (loc.is_file() and loc.suffix.lower() in (".json", ".jsonl"))
        or (loc.is_dir() and not has_configs(loc))
    )
    base_text = spec.params.get("cop_base", "1" if raw_release else "0")
    if base_text not in ("0", "1"):
        raise SourceError(f"source spec: cop_base must be 0 or 1, got {base_text!r}")
    cop_base = int(base_text)
    opened = open_location(
        spec,
        config=spec.params.get("config"),
        data_glob="*.json",
        default_splits=lambda av: [s for s in av if s != "test"],
    )
    col = Collector(spec)
    for part in opened.parts:
        require_columns(part, ["id", "question", *MEDMCQA_OPTIONS, "cop"])
        ctx = Ctx(dataset="medmcqa", prefix="medmcqa", split=part.split, revision=opened.revision)
        col.run(part, ctx, lambda r, c: medmcqa_row(r, c, cop_base))
    return col.items, col.record("medmcqa", opened.revision, spec, cop_base=str(cop_base), **opened.notes)


register(SourceKind("medmcqa", _load_medmcqa, frozenset({"cop_base"}), summary="MedMCQA"))
