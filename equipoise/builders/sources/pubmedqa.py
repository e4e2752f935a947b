"""PubMedQA (pqa_labeled): yes / no / maybe questions over an abstract's context."""

from __future__ import annotations

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
    text_field,
)
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


def _load_pubmedqa(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    config = spec.params.get("config", "pqa_labeled")
    with_context = spec.params.get("context", "1") not in ("0", "false", "no")
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
