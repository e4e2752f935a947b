"""MedQA (USMLE): the 4-option Hub copy and the original 5-option JSONL release."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from equipoise.builders.sources.base import (
    Collector,
    Ctx,
    RowError,
    SourceKind,
    SourceSpec,
    letter_gold,
    make_item,
    open_location,
    opt_text,
    register,
    require_columns,
    text_field,
)
from equipoise.schemas.items import LETTERS, ItemMetadata, MCQItem

DATASET_NAMES = {"medqa4": "medqa_usmle_4", "medqa5": "medqa_usmle_5"}


# ---------------------------------------------------------------------------------------------
# MedQA (USMLE): GBaker/MedQA-USMLE-4-options and the original 5-option JSONL release.
# Layout checked against the Hub tree of GBaker/MedQA-USMLE-4-options (phrases_no_exclude_{train,test}
# .jsonl), the features of its parquet copies (question, answer, options struct A-D, meta_info,
# answer_idx, metamap_phrases) and bigbio's med_qa.py (data_clean/questions/US/{train,dev,test}.jsonl
# with options A-E; US/4_options/phrases_no_exclude_*.jsonl).
# ---------------------------------------------------------------------------------------------
def medqa_row(row: dict[str, Any], ctx: Ctx, n_options: int) -> MCQItem:
    """{question, answer, options {A..}, meta_info, answer_idx[, metamap_phrases]} -> item.

    The id is the row's ``id`` when a copy has one, else :func:`content_id`; ``meta_info`` (the
    USMLE step) is kept as ``metadata.exam_part``."""
    question = text_field(row, "question")
    raw = row.get("options")
    if isinstance(raw, list):  # the bigbio 'source' schema: [{key, value}, ...]
        try:
            raw = {d["key"]: d["value"] for d in raw}
        except (TypeError, KeyError) as exc:
            raise RowError("options", "a list of options must hold {key, value} records") from exc
    if not isinstance(raw, dict):
        raise RowError("options", f"expected a mapping of letters to text, got {type(raw).__name__}")
    letters = list(LETTERS[:n_options])
    extra = sorted(k for k, v in raw.items() if k not in letters and v is not None)
    if extra:
        raise RowError("options", f"unexpected option(s) {extra} for a {n_options}-option source")
    options = []
    for i, letter in enumerate(letters):
        text = opt_text(raw.get(letter))
        if text is None:
            raise RowError(f"options.{letter}", "missing or empty option")
        options.append((i, text))
    gold = letter_gold(row.get("answer_idx"), "answer_idx", letters)
    answer = opt_text(row.get("answer"))
    if answer is not None and answer != options[gold][1]:
        raise RowError(
            "answer", f"answer text {answer!r} differs from option {letters[gold]} {options[gold][1]!r}"
        )
    source_id = opt_text(row.get("id")) or content_id(question, [t for _, t in options], gold)
    return make_item(
        ctx,
        item_id=f"{ctx.prefix}-{ctx.split}-{source_id.removeprefix('sha256:')}",
        source_id=source_id,
        question=question,
        options=options,
        gold=gold,
        metadata=ItemMetadata(exam_part=opt_text(row.get("meta_info"))),
    )


def content_id(question: str, options: list[str], gold: int) -> str:
    """``sha256:<12 hex>`` of an item's content: MedQA rows carry no id, and a row number changes
    as soon as a copy of the file is filtered or reordered, so ids are derived from what the item
    says (the same item keeps its id in every copy)."""
    payload = json.dumps([question, options, gold], ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]


def _numbered(item: MCQItem, seen: dict[str, int]) -> MCQItem:
    """A repeat of identical content in one split gets ``~2``, ``~3``... (which copy is which does not
    matter: they say the same), so an exact duplicate row never stops a build."""
    n = seen[item.item_id] = seen.get(item.item_id, 0) + 1
    if n == 1:
        return item
    new_id = f"{item.item_id}~{n}"
    source = item.source.model_copy(update={"source_id": f"{item.source.source_id}~{n}"})
    return item.model_copy(update={"item_id": new_id, "base_id": new_id, "source": source})


def _load_medqa(spec: SourceSpec, n_options: int) -> tuple[list[MCQItem], dict[str, str]]:
    opened = open_location(spec, config=spec.params.get("config"), data_glob="*.jsonl")
    name = DATASET_NAMES[spec.kind]
    col = Collector(spec)
    seen: dict[str, int] = {}
    for part in opened.parts:
        require_columns(part, ["question", "options", "answer_idx"])
        ctx = Ctx(dataset=name, prefix=spec.kind, split=part.split, revision=opened.revision)
        col.run(part, ctx, lambda r, c: _numbered(medqa_row(r, c, n_options), seen))
    return col.items, col.record(name, opened.revision, spec, **opened.notes)


register(SourceKind("medqa4", lambda s: _load_medqa(s, 4), summary="MedQA USMLE, 4 options"))
register(SourceKind("medqa5", lambda s: _load_medqa(s, 5), summary="MedQA USMLE, 5 options"))
