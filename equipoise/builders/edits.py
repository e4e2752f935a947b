"""Key-context edits from anywhere (a span, an LLM, a file made elsewhere) and the one check they pass.

A perturbed question (MedAbstain's NAP) is only useful if something that mattered was taken out, so
every edit, whatever made it and whether it was just produced or read back from a cache or a file,
goes through :func:`check_edit` before it becomes a row.  The check is deliberately about the
*result*, not about how the removal was phrased: an LLM or a human often paraphrases the removed fact
(the MedAbstain release's ``gold_context`` is rarely a verbatim span of its question), so a
paraphrased removal is accepted, while a no-op, or an edit that still holds the removed text
verbatim, or one that drops no word of the original (a rewording), is rejected.

Where the removed text is meant to be a span of the question (an annotated key fact), it is located
by :func:`align`: verbatim when it occurs exactly once, else by rapidfuzz's best partial alignment,
snapped to word boundaries, whose score is recorded in the row's provenance.

``--edits FILE`` reads precomputed edits (JSON lines, one :class:`EditRow` per line) with per-row
errors naming the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from equipoise.builders.sources.mini import SourceError

# Below this rapidfuzz partial-alignment score (0-100) a key fact is "not found" in the question.
MIN_FUZZY_SCORE = 80.0
_WORD = re.compile(r"\w+")
_TOKEN = re.compile(r"\S+")


def normalise(text: str) -> str:
    """Lower case, single spaces: what the edit check compares (layout changes are no edit)."""
    return " ".join(text.split()).lower()


def align(fact: str, question: str) -> tuple[int, int, float] | None:
    """Character span ``(start, end, score)`` of ``fact`` in ``question``.

    Exactly one verbatim occurrence scores 100.  Otherwise rapidfuzz's best partial alignment of the
    fact in the question is widened to whole words; None when the fact occurs more than once (which
    one is meant cannot be told), is longer than the question, or aligns below
    :data:`MIN_FUZZY_SCORE` (the score is rapidfuzz's ``ratio`` of the fact and the removed span,
    case-insensitive)."""
    fact = fact.strip()
    n = question.count(fact) if fact else 0
    if n == 1:
        start = question.index(fact)
        return start, start + len(fact), 100.0
    if n > 1 or not fact or len(fact) >= len(question):
        return None
    from rapidfuzz import fuzz

    al = fuzz.partial_ratio_alignment(fact, question, processor=str.lower)
    if al is None or al.score < MIN_FUZZY_SCORE:
        return None
    # rapidfuzz's window has the fact's length and may cut words; take the whole-word span near it
    # that matches the fact best (ties: the earliest, then the shortest)
    words = [(m.start(), m.end()) for m in _TOKEN.finditer(question)]
    slack = max(12, len(fact) // 4)
    starts = [s for s, _ in words if abs(s - al.dest_start) <= slack]
    ends = [e for _, e in words if abs(e - al.dest_end) <= slack]
    target = fact.lower()
    best = max(
        ((s, e) for s in starts for e in ends if e > s),
        key=lambda se: (fuzz.ratio(target, question[se[0] : se[1]].lower()), -se[0], -(se[1] - se[0])),
        default=None,
    )
    if best is None:
        return None
    score = fuzz.ratio(target, question[best[0] : best[1]].lower())
    if score < MIN_FUZZY_SCORE:
        return None
    return best[0], best[1], round(float(score), 2)


def check_edit(original: str, edited: str, removed: str) -> str | None:
    """Why an edit of ``original`` into ``edited`` removing ``removed`` is unusable (None: usable)."""
    o, e, r = normalise(original), normalise(edited), normalise(removed).rstrip(".")
    if not e:
        return "the edited question is empty"
    if e == o:
        return "no-op: the edited question equals the original"
    if r:
        whole = re.compile(rf"(?<!\w){re.escape(r)}(?!\w)")  # as words: 'x' is not in 'next'
        if whole.search(o) and whole.search(e):
            return "the edited question still contains the removed text verbatim"
    if not Counter(_WORD.findall(o)) - Counter(_WORD.findall(e)):  # counts: a repeated word can go
        return "the edited question drops no word of the original (a rewording, not a removal)"
    return None


class EditRow(BaseModel):
    """One line of an ``--edits`` file: a perturbation made elsewhere for one source item."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    item_id: str = Field(min_length=1, description="The source item's id (its base id or source id).")
    perturbed_question: str = Field(min_length=1)
    removed_text: str = Field(min_length=1)
    rationale: str | None = None
    producer: str | None = Field(default=None, description="Who or what made the edit (model, person).")


class ImportedEdit(BaseModel):
    """An edit read from a file, with where it came from (kept whole in the row's provenance)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    perturbed_question: str
    removed_text: str
    file: str
    sha256: str
    row: int
    producer: str | None = None
    rationale: str | None = None
    original_question: str | None = None
    extra: dict[str, str] = Field(default_factory=dict)


def sha256_hex(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_edits(path: Path) -> list[tuple[EditRow, ImportedEdit]]:
    """Read an ``--edits`` JSONL file; every bad line raises naming the file, row and field."""
    if not path.is_file():
        raise SourceError(f"{path}: edits file not found")
    digest = sha256_hex(path)
    out: list[tuple[EditRow, ImportedEdit]] = []
    seen: dict[str, int] = {}
    row = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row += 1
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SourceError(f"{path}: row {row}: field '<json>': not valid JSON ({exc.msg})") from exc
        try:
            er = EditRow.model_validate(raw)
        except ValidationError as exc:
            e = exc.errors()[0]
            loc = ".".join(str(p) for p in e["loc"]) or "<row>"
            raise SourceError(f"{path}: row {row}: field '{loc}': {e['msg']}") from exc
        if er.item_id in seen:
            raise SourceError(
                f"{path}: row {row}: field 'item_id': {er.item_id!r} already has an edit "
                f"(row {seen[er.item_id]})"
            )
        seen[er.item_id] = row
        out.append(
            (
                er,
                ImportedEdit(
                    perturbed_question=er.perturbed_question,
                    removed_text=er.removed_text,
                    file=path.name,
                    sha256=digest,
                    row=row,
                    producer=er.producer,
                    rationale=er.rationale,
                ),
            )
        )
    if not out:
        raise SourceError(f"{path}: no edits in the file (expected one JSON object per line)")
    return out
