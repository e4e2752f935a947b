"""Pure, seeded, composable transforms on ``MCQItem``; each appends one provenance step.

Every transform returns a *new* item (items are frozen), re-letters options A, B, C... in their new
order and keeps each option's ``option_id``, so the target follows the option's identity, not its
letter. Randomness comes only from ``random.Random(sub_seed(seed, transform, base_id, ...))``: the
same item and seed give the same result regardless of build order, and a derived variant (AP) reuses
exactly the choices of its parent (A's abstain position, NAP's edit).

Every model here is frozen, so a new item shares its unchanged parts (options whose letter stays,
earlier provenance steps, the source and metadata, the fixed abstain / NOTA options and identical
provenance steps) with other items instead of copying them; each emitted item is still validated.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from equipoise.builders.clindet import sub_seed
from equipoise.schemas.clindet import canonical_json
from equipoise.schemas.items import (
    ABSTAIN_TEXT,
    LETTERS,
    NOTA_TEXT,
    LLMEdit,
    MCQItem,
    Option,
    TransformStep,
)

if TYPE_CHECKING:
    from equipoise.builders.edits import ImportedEdit

TRANSFORM_VERSION = "1.1.0"

# MCQItem's fields in declaration order: read once rather than through pydantic's generic __iter__
_ITEM_FIELDS: tuple[str, ...] = tuple(MCQItem.model_fields)

# runs of whitespace left where a key-fact span was cut out (compiled once, used per item)
_MULTISPACE = re.compile(r"\s{2,}")


class TransformError(ValueError):
    """A transform that cannot apply to an item (names the item and the reason)."""


# Provenance steps repeat across items (every NOTA item gets the same ``add_nota`` step), and a
# step is immutable, so an identical one is shared instead of re-encoding its JSON and re-validating
# it per item. Bounded: emptied when full (a cache miss only costs the rebuild).
_STEP_CACHE: dict[tuple[object, ...], TransformStep] = {}
_STEP_CACHE_MAX = 4096


class _Uncacheable(Exception):
    """A parameter value the step cache does not key (the step is then built uncached)."""


def _key(value: object) -> object:
    """Hashable key that tells apart what JSON tells apart: the type travels with the value, since
    ``1 == True`` but they encode as ``1`` and ``true``. Floats are left out (``0.0 == -0.0``)."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return (kind, value)
    if kind is list and isinstance(value, list):  # (isinstance only narrows the type)
        return (kind, tuple(_key(v) for v in value))
    raise _Uncacheable


def _step_key(name: str, params: dict, seed: int | None) -> tuple[object, ...] | None:
    """Cache key of a step without extra fields, or None when a value is not one the key covers."""
    if type(name) is not str or type(params) is not dict or not (seed is None or type(seed) is int):
        return None
    try:
        keyed = []
        for k, v in params.items():
            if type(k) is not str:
                return None
            keyed.append((k, _key(v)))
    except _Uncacheable:
        return None
    return (name, seed, tuple(keyed))


def _step(name: str, params: dict, seed: int | None = None, **extra: object) -> TransformStep:
    key = None if extra else _step_key(name, params, seed)
    if key is not None:
        hit = _STEP_CACHE.get(key)
        if hit is not None:
            return hit
    step = TransformStep(
        name=name, version=TRANSFORM_VERSION, params_json=canonical_json(params), seed=seed, **extra
    )
    if key is not None:
        if len(_STEP_CACHE) >= _STEP_CACHE_MAX:
            _STEP_CACHE.clear()
        _STEP_CACHE[key] = step
    return step


def _relabel(option: Option, label: str) -> Option:
    """``option`` shown under ``label``; the same (immutable) object when the letter is unchanged."""
    if option.label == label:
        return option
    return option.model_copy(update={"label": label})


def _rebuild(
    item: MCQItem,
    options: Sequence[Option],
    target_id: str,
    step: TransformStep,
    *,
    question: str | None = None,
    abstain_expected: bool | None = None,
    item_id: str | None = None,
) -> MCQItem:
    # Options are relettered by index into LETTERS, so every label matches the field's ^[A-Z]$
    # pattern by construction (more than 26 options fails here, as it always did).
    relettered = [_relabel(o, LETTERS[i]) for i, o in enumerate(options)]
    target = next(o.label for o in relettered if o.option_id == target_id)
    data = {name: getattr(item, name) for name in _ITEM_FIELDS}
    data.update(
        options=relettered,
        target_label=target,
        question=question if question is not None else item.question,
        abstain_expected=item.abstain_expected if abstain_expected is None else abstain_expected,
        provenance=[*item.provenance, step],
    )
    if item_id is not None:
        data["item_id"] = item_id
    # Re-validate: a transform can never emit an item that breaks the schema's invariants. The
    # nested values are already-validated frozen models (Option, SourceRef, ItemMetadata,
    # TransformStep), which pydantic accepts as they are instead of re-validating a dump of
    # them; the item's own fields and its model validator (labels, target, ids, gold) still run.
    try:
        return MCQItem.model_validate(data)
    except ValidationError:
        # The error's text embeds the input, and it is recorded in a build's manifest (failures),
        # so raise it from the plain-data form the transforms have always validated.
        MCQItem.model_validate(_plain(data))
        raise


def _plain(data: dict[str, object]) -> dict[str, object]:
    """``data`` with every nested model dumped to plain dicts (the rare error path only)."""
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, list):
            out[key] = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
        else:
            out[key] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


def _abstain_option(framing: str, text: str | None = None) -> Option:
    if text is None:
        return _standard_abstain_option(framing)
    return _make_abstain_option(framing, text)


@functools.lru_cache(maxsize=16)
def _standard_abstain_option(framing: str) -> Option:
    # validated once per framing and then shared: options are frozen, and the standard texts recur
    # in every item of a config (an unknown framing raises and is not cached)
    return _make_abstain_option(framing, None)


def _make_abstain_option(framing: str, text: str | None) -> Option:
    return Option(
        label="A",
        text=text or ABSTAIN_TEXT[framing],
        role="abstain",
        framing=framing,  # type: ignore[arg-type]
        option_id=f"abstain:{framing}",
    )


@functools.lru_cache(maxsize=1)
def _nota_option() -> Option:
    return Option(label="A", text=NOTA_TEXT, role="nota", option_id="nota")


def _position(n_slots: int, position: int | str, item: MCQItem, *seed_parts: object) -> int:
    """Slot for an inserted option; the seeded generator is only built for ``'random'``, the one
    choice that draws from it (fixed positions never consumed a number, so output is unchanged)."""
    if position == "random":
        return random.Random(sub_seed(*seed_parts)).randrange(n_slots)
    if position == "last":
        return n_slots - 1
    if isinstance(position, int) and 0 <= position < n_slots:
        return position
    raise TransformError(f"{item.item_id}: position {position!r} not in 0..{n_slots - 1}")


def insert_abstain(
    item: MCQItem,
    framing: str = "Abstain",
    position: int | str = "random",
    seed: int = 0,
    text: str | None = None,
) -> MCQItem:
    """Add an abstain option (the target is unchanged): MedAbstain's A variant, CLEAR's +IDK."""
    if any(o.framing == framing for o in item.options):
        raise TransformError(f"{item.item_id}: already has an abstain option framed {framing}")
    opts = list(item.options)
    pos = _position(len(opts) + 1, position, item, seed, "insert_abstain", item.base_id, framing)
    opts.insert(pos, _abstain_option(framing, text))
    step = _step("insert_abstain", {"framing": framing, "position": position, "index": pos}, seed)
    return _rebuild(item, opts, item.target.option_id, step)


def replace_gold(
    item: MCQItem, replacement: str = "NA", position: str = "gold", seed: int = 0, text: str | None = None
) -> MCQItem:
    """Remove the gold option and put an abstain option (NA / IDK / INA / Abstain) or NOTA in its
    place; the replacement becomes the target (CLEAR's abstention tasks, NOTA's -correct+nota)."""
    gold = [i for i, o in enumerate(item.options) if o.role == "gold"]
    if not gold:
        raise TransformError(f"{item.item_id}: no gold option to replace")
    opts = list(item.options)
    idx = gold[0]
    del opts[idx]
    new = _nota_option() if replacement == "nota" else _abstain_option(replacement, text)
    if any(o.option_id == new.option_id for o in opts):
        raise TransformError(f"{item.item_id}: already has option {new.option_id}")
    pos = (
        idx
        if position == "gold"
        else _position(len(opts) + 1, position, item, seed, "replace_gold", item.base_id, replacement)
    )
    opts.insert(pos, new)
    step = _step("replace_gold", {"replacement": replacement, "position": position, "index": pos}, seed)
    return _rebuild(item, opts, new.option_id, step)


def add_nota(item: MCQItem, position: int | str = "last", seed: int = 0) -> MCQItem:
    """Add a 'None of the options is correct' distractor while the gold stays (NOTA's +nota)."""
    if any(o.role == "nota" for o in item.options):
        raise TransformError(f"{item.item_id}: already has a NOTA option")
    opts = list(item.options)
    pos = _position(len(opts) + 1, position, item, seed, "add_nota", item.base_id)
    opts.insert(pos, _nota_option())
    return _rebuild(item, opts, item.target.option_id, _step("add_nota", {"position": position}, seed))


def keep_k_distractors(item: MCQItem, k: int, seed: int = 0) -> MCQItem:
    """Keep the target and ``k`` distractors sampled without replacement (CLEAR's S_k); other
    options (abstain, NOTA) are kept; relative order is preserved."""
    dis = [o for o in item.options if o.role == "distractor"]
    if not 1 <= k <= len(dis):
        raise TransformError(f"{item.item_id}: k={k} but {len(dis)} distractors available")
    rng = random.Random(sub_seed(seed, "keep_k", item.base_id, k))
    keep = {o.option_id for o in rng.sample(dis, k)}
    opts = [o for o in item.options if o.role != "distractor" or o.option_id in keep]
    step = _step("keep_k_distractors", {"k": k, "kept": sorted(keep)}, seed)
    return _rebuild(item, opts, item.target.option_id, step)


def shuffle_options(item: MCQItem, n: int, seed: int = 0) -> list[MCQItem]:
    """``n`` permutations of the options (distinct while possible); the first is a real shuffle
    too, so no permutation silently equals the source order unless chance picks it."""
    rng = random.Random(sub_seed(seed, "shuffle", item.base_id))
    seen: set[tuple[str, ...]] = set()
    out = []
    m = len(item.options)
    max_distinct = 1
    for i in range(2, m + 1):
        max_distinct *= i
    for i in range(n):
        for _ in range(100):
            perm = list(item.options)
            rng.shuffle(perm)
            key = tuple(o.option_id for o in perm)
            if key not in seen or len(seen) >= max_distinct:
                break
        seen.add(key)
        step = _step("shuffle_options", {"n": n, "index": i, "order": list(key)}, seed)
        out.append(_rebuild(item, perm, item.target.option_id, step, item_id=f"{item.item_id}~p{i}"))
    return out


def remove_key_context_span(item: MCQItem) -> MCQItem:
    """Delete the annotated key fact from the question (MedAbstain's NAP, without an LLM).

    Deterministic: the removed text and the original question are recorded in the step.  A key fact
    that is not a verbatim span (a paraphrase, changed punctuation) is located by fuzzy alignment
    (:func:`equipoise.builders.edits.align`) and the alignment score is recorded in the parameters.
    """
    from equipoise.builders.edits import align, check_edit

    fact = item.metadata.key_fact
    if not fact:
        raise TransformError(f"{item.item_id}: no annotated key_fact to remove")
    if item.question.count(fact) > 1:
        raise TransformError(f"{item.item_id}: key_fact does not occur exactly once in the question")
    span = align(fact, item.question)
    if span is None:
        raise TransformError(
            f"{item.item_id}: key_fact not found in the question (no alignment scores >= 80 of 100)"
        )
    start, end, score = span
    removed = item.question[start:end]
    edited = _MULTISPACE.sub(" ", item.question[:start] + " " + item.question[end:]).strip()
    # a verbatim fact occurring once passes the edit check by construction (the question loses it and
    # its words); a fuzzily aligned span is checked like any other edit
    problem = check_edit(item.question, edited, removed) if score < 100.0 else None
    if problem:
        raise TransformError(f"{item.item_id}: span removal: {problem}")
    params: dict[str, object] = {"method": "span"}
    if score < 100.0:
        params.update(match="fuzzy", score=str(score))  # str: floats do not key the step cache
    step = _step("remove_key_context", params, None, removed_text=removed, original_question=item.question)
    return _rebuild(item, item.options, item.target.option_id, step, question=edited, abstain_expected=True)


def apply_llm_edit(item: MCQItem, edit: LLMEdit) -> MCQItem:
    """Apply a recorded LLM context-removal edit (see :mod:`equipoise.builders.llm_perturb`)."""
    from equipoise.builders.edits import check_edit

    if edit.original_question != item.question:
        raise TransformError(f"{item.item_id}: the edit was made for a different question text")
    problem = check_edit(item.question, edit.edited_question, edit.removed_fact)
    if problem:
        raise TransformError(f"{item.item_id}: LLM edit rejected: {problem}")
    step = _step(
        "remove_key_context",
        {"method": "llm", "model": edit.model},
        None,
        removed_text=edit.removed_fact,
        original_question=item.question,
        llm_edit=edit,
    )
    return _rebuild(
        item, item.options, item.target.option_id, step, question=edit.edited_question, abstain_expected=True
    )


def apply_imported_edit(item: MCQItem, edit: ImportedEdit) -> MCQItem:
    """Apply an edit made elsewhere (``--edits FILE``, the MedAbstain release's perturbed files).

    The edit passes the same check as every other edit; its file, sha256, row, producer and the
    source's own annotations (``extra``: e.g. the release's ``gold_context`` and ``reason``) are
    recorded, with the alignment score of the removed text in the original when it aligns."""
    from equipoise.builders.edits import align, check_edit, normalise

    where = f"{edit.file} row {edit.row}"
    if edit.original_question is not None and normalise(edit.original_question) != normalise(item.question):
        raise TransformError(f"{item.item_id}: edit ({where}) was made for a different question text")
    problem = check_edit(item.question, edit.perturbed_question, edit.removed_text)
    if problem:
        raise TransformError(f"{item.item_id}: edit ({where}) rejected: {problem}")
    span = align(edit.removed_text, item.question)
    params: dict[str, object] = {
        "method": "imported",
        "file": edit.file,
        "sha256": edit.sha256,
        "row": edit.row,
        "producer": edit.producer,
        "rationale": edit.rationale,
        "removed_text_alignment": None if span is None else str(span[2]),
        **{f"source_{k}": v for k, v in sorted(edit.extra.items())},
    }
    step = _step(
        "remove_key_context", params, None, removed_text=edit.removed_text, original_question=item.question
    )
    return _rebuild(
        item,
        item.options,
        item.target.option_id,
        step,
        question=edit.perturbed_question.strip(),
        abstain_expected=True,
    )


def set_variant(item: MCQItem, variant: str) -> MCQItem:
    """Name the variant and derive a unique item id from the base id."""
    return item.model_copy(update={"variant": variant, "item_id": f"{item.base_id}:{variant}"})
