"""MedQA (USMLE): the 4-option Hub copy and the original 5-option JSONL release."""

from __future__ import annotations

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
from equipoise.schemas.items import LETTERS, MCQItem

DATASET_NAMES = {"medqa4": "medqa_usmle_4", "medqa5": "medqa_usmle_5"}


# ---------------------------------------------------------------------------------------------
# MedQA (USMLE): GBaker/MedQA-USMLE-4-options and the original 5-option JSONL release.
# Layout checked against the Hub tree of GBaker/MedQA-USMLE-4-options (phrases_no_exclude_{train,test}
# .jsonl), the features of its parquet copies (question, answer, options struct A-D, meta_info,
# answer_idx, metamap_phrases) and bigbio's med_qa.py (data_clean/questions/US/{train,dev,test}.jsonl
# with options A-E; US/4_options/phrases_no_exclude_*.jsonl).
# ---------------------------------------------------------------------------------------------
def medqa_row(row: dict[str, Any], ctx: Ctx, n_options: int) -> MCQItem:
    """{question, answer, options {A..}, meta_info, answer_idx[, metamap_phrases]} -> item."""
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
    n = f"{ctx.n:06d}"
    return make_item(
        ctx,
        item_id=f"{ctx.prefix}-{ctx.split}-{n}",
        source_id=f"{ctx.split}-{n}",
        question=question,
        options=options,
        gold=gold,
    )


def _load_medqa(spec: SourceSpec, n_options: int) -> tuple[list[MCQItem], dict[str, str]]:
    opened = open_location(spec, config=spec.params.get("config"), data_glob="*.jsonl")
    name = DATASET_NAMES[spec.kind]
    col = Collector(spec)
    for part in opened.parts:
        require_columns(part, ["question", "options", "answer_idx"])
        ctx = Ctx(dataset=name, prefix=spec.kind, split=part.split, revision=opened.revision)
        col.run(part, ctx, lambda r, c: medqa_row(r, c, n_options))
    return col.items, col.record(name, opened.revision, spec, **opened.notes)


register(SourceKind("medqa4", lambda s: _load_medqa(s, 4), summary="MedQA USMLE, 4 options"))
register(SourceKind("medqa5", lambda s: _load_medqa(s, 5), summary="MedQA USMLE, 5 options"))
