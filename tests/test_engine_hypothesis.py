"""Property-based check of the determinability engine against brute-force enumeration.

For every bundled scoring system, hypothesis draws partial findings (each input either missing or set
to a value from its grid / choices) and the engine's reachable totals and per-criterion labels must
equal what plain enumeration of every completion gives:

* ``test_engine_matches_enumeration_of_every_grid_value`` enumerates *raw* values (every grid point of
  a missing numeric input): nothing of the engine is used on the reference side. Only small missing
  sets fit, so the strategy spends a completion budget while it decides which inputs go missing.
* ``test_engine_matches_enumeration_over_classes`` lets any subset go missing (all of them included)
  and enumerates, for each missing numeric input, the values `bruteforce.cut_candidates` reads from
  the definition's bounds (each bound and the floats just either side of it): every real value in
  range scores like one of them, so no engine class is trusted. Known numeric values are drawn off
  the grid too (any float in range, bounds and their neighbours). Here the witnesses are also
  checked to be real completions.

Hypothesis's example database is off (``database=None``) so runs leave nothing in the working tree.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from equipoise.schemas.scoring import ScoringSystem
from equipoise.scoring_systems.engine import compile_system, evaluate, score_values
from tests import bruteforce
from tests.conftest import SYSTEM_IDS, SYSTEMS

GRID_CAP = 3000  # raw completions per example (score_values costs ~20 us each)
CLASS_CAP = 6000  # class completions per example

_SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _settings(max_examples: int) -> settings:
    return settings(_SETTINGS, max_examples=max_examples)


@st.composite
def grid_findings(draw: st.DrawFn, system: ScoringSystem, cap: int) -> tuple[dict, list[str]]:
    """Known values from each input's grid / choices; an input may go missing while the product of the
    missing inputs' raw value counts stays within ``cap`` (inputs are visited in a drawn order, so
    any input can be the one that goes missing)."""
    order = draw(st.permutations(list(system.inputs)))
    known: dict[str, object] = {}
    missing: list[str] = []
    space = 1
    for inp in order:
        pool = bruteforce.candidates(inp)
        if space * len(pool) <= cap and draw(st.booleans()):
            missing.append(inp.id)
            space *= len(pool)
        else:
            known[inp.id] = draw(st.sampled_from(pool))
    return known, missing


def any_value(system: ScoringSystem, inp) -> st.SearchStrategy:
    """A known value: a choice, or for a numeric input a grid value, a bound or a float next to
    one, or any float in range (almost surely off the grid)."""
    if inp.kind != "numeric":
        return st.sampled_from(bruteforce.candidates(inp))
    return st.one_of(
        st.sampled_from(bruteforce.candidates(inp)),
        st.sampled_from(bruteforce.cut_candidates(system, inp)),
        st.floats(min_value=inp.min, max_value=inp.max, allow_nan=False, allow_infinity=False),
    )


@st.composite
def any_partial_findings(draw: st.DrawFn, system: ScoringSystem) -> tuple[dict, list[str]]:
    """Any subset missing (empty and full included); known values on or off the grid."""
    flags = draw(st.lists(st.booleans(), min_size=len(system.inputs), max_size=len(system.inputs)))
    known: dict[str, object] = {}
    missing: list[str] = []
    for inp, gone in zip(system.inputs, flags, strict=True):
        if gone:
            missing.append(inp.id)
        else:
            known[inp.id] = draw(any_value(system, inp), label=inp.id)
    return known, missing


def _labels(ev) -> dict[str, str]:
    return {c: r.label for c, r in ev.criteria.items()}


@pytest.mark.parametrize("system_id", SYSTEM_IDS)
@_settings(max_examples=15)
@given(data=st.data())
def test_engine_matches_enumeration_of_every_grid_value(system_id: str, data: st.DataObject) -> None:
    system = SYSTEMS[system_id]
    known, missing = data.draw(grid_findings(system, GRID_CAP), label="findings")
    assume(bruteforce.space_size(system, missing) <= GRID_CAP)
    expect = bruteforce.reachable(system, known)  # raw grid values, no engine classes
    ev = evaluate(system, known)
    assert ev.reachable == expect, f"{system_id} known={known}"
    assert _labels(ev) == bruteforce.labels(system, expect), f"{system_id} known={known}"
    assert sorted(ev.missing) == sorted(missing)


@pytest.mark.parametrize("system_id", SYSTEM_IDS)
@_settings(max_examples=10)
@given(data=st.data())
def test_engine_matches_enumeration_over_classes(system_id: str, data: st.DataObject) -> None:
    system = SYSTEMS[system_id]
    cs = compile_system(system)
    known, missing = data.draw(any_partial_findings(system), label="findings")
    space = 1
    brute_space = 1
    for i in missing:
        space *= len(cs.classes[i])
        inp = system.input(i)
        brute_space *= (
            len(bruteforce.cut_candidates(system, inp)) if inp.kind == "numeric" else len(cs.classes[i])
        )
    assume(brute_space <= CLASS_CAP)
    cands = {
        i: bruteforce.cut_candidates(system, system.input(i))
        for i in missing
        if system.input(i).kind == "numeric"
    }
    expect = bruteforce.reachable(system, known, cands)
    ev = evaluate(system, known)
    assert ev.reachable == expect, f"{system_id} known={known}"
    assert _labels(ev) == bruteforce.labels(system, expect), f"{system_id} known={known}"
    assert ev.completions == space
    for crit in system.criteria:
        r = ev.criteria[crit.id]
        assert (r.witness_met is not None) == (r.label != "Not met")
        assert (r.witness_not_met is not None) == (r.label != "Met")
        for w, side in ((r.witness_met, True), (r.witness_not_met, False)):
            if w is not None:
                assert set(w) == set(missing)
                assert crit.holds(score_values(system, {**known, **w})) is side
