"""Key-fact alignment (verbatim or fuzzy), the edit check every edit passes, and pools served as the
`train` split of the variant they pair with."""

from __future__ import annotations

import pytest

from equipoise.builders.edits import MIN_FUZZY_SCORE, align, check_edit
from equipoise.builders.mcq_build import build_mcq_suite
from equipoise.builders.transforms import TransformError, remove_key_context_span
from equipoise.schemas.items import ItemMetadata
from tests.conftest import load_local
from tests.mcq_factory import make_item


def _with_fact(fact: str):
    it = make_item(idx=3)
    return it.model_copy(update={"metadata": ItemMetadata(key_fact=fact)})


def test_verbatim_key_fact_is_removed_exactly():
    it = make_item(idx=3)
    out = remove_key_context_span(it)
    assert out.question == "A patient number 3 presents with a cough. Which diagnosis is most likely?"
    assert out.provenance[-1].params == {"method": "span"}  # unchanged for verbatim facts
    assert out.provenance[-1].removed_text == it.metadata.key_fact


@pytest.mark.parametrize(
    "fact",
    [
        "the decisive finding number 3 is present",  # case and final stop differ
        "The decisive finding no. 3 is present.",  # an abbreviation
        "The decisive findings number 3 are present.",  # grammar changed
    ],
)
def test_non_verbatim_key_fact_is_aligned_and_its_score_recorded(fact):
    it = _with_fact(fact)
    assert fact not in it.question
    out = remove_key_context_span(it)
    assert out.question == "A patient number 3 presents with a cough. Which diagnosis is most likely?"
    params = out.provenance[-1].params
    assert params["method"] == "span" and params["match"] == "fuzzy"
    assert MIN_FUZZY_SCORE <= float(params["score"]) < 100
    assert out.provenance[-1].removed_text == "The decisive finding number 3 is present."


def test_alignment_agrees_with_an_independent_scan():
    """Cross-check the rapidfuzz window against a brute-force scan of every word-aligned span with
    difflib's ratio: both must pick the span holding the fact."""
    import difflib

    q = "A 61-year-old has dyspnoea. Her troponin is 2.3 ng/mL at six hours. Which is the next step?"
    fact = "Troponin was 2.3 ng/mL at 6 hours."
    start, end, score = align(fact, q)
    words = [(m.start(), m.end()) for m in __import__("re").finditer(r"\S+", q)]
    best = max(
        ((a[0], b[1]) for i, a in enumerate(words) for b in words[i:]),
        key=lambda s: difflib.SequenceMatcher(None, fact.lower(), q[s[0] : s[1]].lower()).ratio(),
    )
    assert q[start:end] == q[best[0] : best[1]]
    assert "troponin is 2.3 ng/mL at six hours." in q[start:end] and "dyspnoea" not in q[start:end]
    assert score >= MIN_FUZZY_SCORE


def test_unrelated_or_ambiguous_fact_is_refused():
    with pytest.raises(TransformError, match="key_fact not found"):
        remove_key_context_span(_with_fact("Serum potassium is 6.8 mmol/L on arrival."))
    assert align("zzz qqq", "A patient presents with a cough.") is None
    it = make_item(idx=3)
    doubled = it.model_copy(update={"question": it.question + " " + it.metadata.key_fact})
    with pytest.raises(TransformError, match="exactly once"):
        remove_key_context_span(doubled)


@pytest.mark.parametrize(
    ("edited", "removed", "problem"),
    [
        ("A patient has a cough. Fever to 39 C. What next?", "Fever to 39 C.", "no-op"),
        ("a patient has a cough.   fever to 39 c. what next?", "Fever to 39 C.", "no-op"),
        ("A patient has a cough. Fever to 39 C.", "What next?", None),  # a real removal
        ("A patient has a cough. What next?", "Fever to 39 C.", None),
        ("A patient has a cough. What next?", "the temperature was high", None),  # paraphrased removal
        ("A patient has a cough. Fever to 39 C. What?", "Fever to 39 C.", "still contains"),
        ("What next? A patient has a cough. Fever to 39 C.", "the fever", "drops no word"),
        ("", "Fever to 39 C.", "empty"),
        ("A patient has a cough. What next?", "Fever to 39 C.", None),
        # removing a sentence whose words all occur elsewhere is still a removal (word counts drop)
        ("A patient has a cough. Fever to 39 C.", "What next?", None),
    ],
)
def test_edit_check(edited, removed, problem):
    got = check_edit("A patient has a cough. Fever to 39 C. What next?", edited, removed)
    assert (got is None) if problem is None else (problem in got)


def test_removal_of_a_sentence_with_repeated_words_is_accepted():
    q = "Cough for a week. The cough is dry. Which test is next?"
    assert check_edit(q, "Cough for a week. Which test is next?", "The cough is dry.") is None
    assert "drops no word" in check_edit(q, "The cough is dry. Cough for a week. Which test is next?", "x")


def test_pools_are_the_train_split_of_their_variant(tmp_path):
    out = tmp_path / "ds"
    build_mcq_suite("medabstain", out, seed=5)
    for variant, pool in (
        ("NA", "pool_NA"),
        ("A", "pool_A"),
        ("NAP", "pool_P-NA"),
        ("AP", "pool_P-RandAbst"),
    ):
        train = load_local(out, variant, split="train")
        assert train["item_id"] == load_local(out, pool)["item_id"] and set(train["variant"]) == {pool}
        assert set(load_local(out, variant)["variant"]) == {variant}  # the test split is the variant
