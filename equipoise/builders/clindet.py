"""Seeded generation of ClinDet-style determinability cases with proved labels.

For every system and criterion the generator builds, at any requested count:

- **complete** cases (every finding stated) balanced between 'Met' and 'Not met';
- **incomplete-determinable** cases: a complete case with findings removed while the label provably
  stays the same for *every* completion (S_min >= T or S_max < T in ClinDet's terms);
- **incomplete-undeterminable** cases: findings removed until completions exist on both sides.

Search works on finding *classes* (see :mod:`equipoise.scoring_systems.engine`), but the label that is
published is recomputed by the engine from the rendered raw values, and the record's validator checks
it against the completion counts, so a search bug cannot leak a wrong label. When a requested
combination cannot be built (a 'Not met' determinable case for a '>= 1' rule has no slack: any missing
item could add the point), the generator reports a shortfall instead of emitting something wrong.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from equipoise.builders.vignette import UNIT_CONVENTIONS, Units, render_vignette, stated_text
from equipoise.schemas.clindet import (
    CONDITIONS,
    Condition,
    DeterminabilityCase,
    canonical_json,
)
from equipoise.schemas.scoring import Criterion, NumericInput, ScoringSystem
from equipoise.scoring_systems.engine import (
    CompiledSystem,
    FindingError,
    _clamp,
    compile_system,
    evaluate,
    grid_value,
    numeric_finding,
    reachable_scaled,
)

GENERATOR_VERSION = "1.0.0"
_MAX_RESTARTS = 40
_CLIMB_STEPS = 300


@dataclass(frozen=True)
class Shortfall:
    """A requested slice the generator could not fill, with the reason."""

    system_id: str
    criterion_id: str
    condition: str
    label: str
    requested: int
    built: int
    reason: str


def sub_seed(*parts: object) -> int:
    """Order-independent seed for one case, so adding a system never changes another's cases."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "big")


class _Search:
    """Class-level helpers for one (system, criterion)."""

    def __init__(self, cs: CompiledSystem, crit: Criterion) -> None:
        self.cs = cs
        self.crit = crit
        self.lo, self.hi = cs.criterion_bounds[crit.id]

    def holds(self, t: int) -> bool:
        return (self.lo is None or t >= self.lo) and (self.hi is None or t <= self.hi)

    def distance(self, t: int, want_met: bool) -> int:
        if want_met:
            if self.lo is not None and t < self.lo:
                return self.lo - t
            if self.hi is not None and t > self.hi:
                return t - self.hi
            return 0
        if not self.holds(t):
            return 0
        up = (self.hi - t + 1) if self.hi is not None else None
        down = (t - self.lo + 1) if self.lo is not None else None
        return min(x for x in (up, down) if x is not None)

    def total(self, cls: dict[str, int]) -> int:
        s = sum(u.table[tuple(cls[i] for i in u.inputs)] for u in self.cs.units)
        return _clamp(self.cs, s)

    def label(self, cls: dict[str, int], missing: list[str]) -> str:
        known = {k: v for k, v in cls.items() if k not in missing}
        counts, _ = reachable_scaled(self.cs, known, missing)
        sides = {self.holds(t) for t in counts}
        if sides == {True}:
            return "Met"
        if sides == {False}:
            return "Not met"
        return "Unable to determine"

    def complete(self, rng: random.Random, want_met: bool) -> dict[str, int] | None:
        """Hill-climb a full class assignment onto the wanted side of the criterion."""
        ids = self.cs.input_ids
        for _ in range(_MAX_RESTARTS):
            cls = {i: rng.randrange(len(self.cs.classes[i])) for i in ids}
            d = self.distance(self.total(cls), want_met)
            for _ in range(_CLIMB_STEPS):
                if d == 0:
                    return cls
                i = rng.choice(ids)
                n = len(self.cs.classes[i])
                if n < 2:
                    continue
                old = cls[i]
                cls[i] = rng.choice([c for c in range(n) if c != old])
                nd = self.distance(self.total(cls), want_met)
                if nd < d or (nd == d and rng.random() < 0.5):
                    d = nd
                else:
                    cls[i] = old
            if d == 0:
                return cls
        return None


def _sample_value(cs: CompiledSystem, input_id: str, cls_idx: int, rng: random.Random) -> bool | str | float:
    inp = cs.system.input(input_id)
    rep = cs.classes[input_id][cls_idx]
    if not isinstance(inp, NumericInput):
        return rep
    segs = cs.class_ranges[input_id][cls_idx]
    lo, hi = rng.choice(segs)
    k_lo = round((lo - inp.min) / inp.step)
    k_hi = round((hi - inp.min) / inp.step)
    k_norm = round((inp.normal - inp.min) / inp.step)
    mode = min(max(k_norm, k_lo), k_hi)
    # triangular toward the normal value, pulled halfway in again: values stay inside the class but
    # rarely sit at physiological extremes (a class of 'SpO2 <= 91%' rarely yields 50%)
    k = mode + (rng.triangular(k_lo, k_hi, mode) - mode) * 0.5 if k_hi > k_lo else k_lo
    k = min(max(round(k), k_lo), k_hi)
    # the nearest grid value whose statement in every convention (rounded) lies in the same
    # class, so an SI or US vignette states a value with the same label; chosen whatever --units
    # is, so SI and US builds of one seed hold identical findings
    for d in range(k_hi - k_lo + 1):
        for kk in (k - d, k + d) if d else (k,):
            if k_lo <= kk <= k_hi and _statements_keep_class(cs, inp, grid_value(inp, kk), cls_idx):
                return grid_value(inp, kk)
    raise _NoValue(f"{cs.system.id}.{input_id}: no grid value of class {cls_idx} keeps its class when stated")


class _NoValue(Exception):
    """A class whose grid values all change class when stated in another unit (try other classes)."""


def _statements_keep_class(cs: CompiledSystem, inp: NumericInput, value: float, cls_idx: int) -> bool:
    for units in UNIT_CONVENTIONS:
        stated = stated_text(inp, value, units)
        if stated is None:
            continue
        # read back exactly as `evaluate` reads a finding with a unit (converted, then rounded to
        # the input's reporting precision), so the stated text gets the case's label
        try:
            back = numeric_finding(inp, {"value": float(stated[0]), "unit": stated[1]})
        except FindingError:
            return False
        if cs.class_of(inp.id, back) != cls_idx:
            return False
    return True


def _attempt(
    search: _Search, condition: Condition, source_label: str, rng: random.Random
) -> tuple[dict[str, int], list[str]] | None:
    want_met = source_label == "Met"
    cls = search.complete(rng, want_met)
    if cls is None:
        return None
    ids = list(search.cs.input_ids)
    if condition == "complete":
        return cls, []
    order = ids[:]
    rng.shuffle(order)
    removed: list[str] = []
    if condition == "incomplete_determinable":
        target = rng.randint(1, max(1, len(ids) - 1))
        for i in order:
            if len(removed) >= target:
                break
            if search.label(cls, [*removed, i]) == source_label:
                removed.append(i)
        return (cls, removed) if removed else None
    # undeterminable: remove until both sides are reachable, then maybe a little more
    for i in order:
        removed.append(i)
        if search.label(cls, removed) == "Unable to determine":
            extra = [j for j in order if j not in removed]
            for j in extra[: rng.randint(0, min(2, len(extra)))]:
                removed.append(j)
            return cls, removed
    return None


def build_case(
    system: ScoringSystem,
    criterion: Criterion,
    condition: Condition,
    source_label: str,
    index: int,
    seed: int,
    attempts: int = 30,
    start: tuple[dict[str, int], str] | None = None,
    units: Units = "us",
) -> DeterminabilityCase | None:
    """Build one case, or None when no attempt yields the requested condition and label."""
    cs = compile_system(system)
    search = _Search(cs, criterion)
    rng = random.Random(sub_seed(seed, system.id, criterion.id, condition, source_label, index))
    for _ in range(attempts):
        if start is not None:  # a proved witness: remove its finding (plus whatever else keeps the label)
            cls0, first = start
            removed0 = [first]
            for j in rng.sample(cs.input_ids, len(cs.input_ids)):
                if j != first and rng.random() < 0.5 and search.label(cls0, [*removed0, j]) == source_label:
                    removed0.append(j)
            got: tuple[dict[str, int], list[str]] | None = (dict(cls0), removed0)
        else:
            got = _attempt(search, condition, source_label, rng)
        if got is None:
            continue
        cls, removed = got
        try:
            values = {i: _sample_value(cs, i, c, rng) for i, c in cls.items()}
        except _NoValue:
            continue
        known = {i: v for i, v in values.items() if i not in removed}
        ev = evaluate(system, known)
        result = ev.criteria[criterion.id]
        # the published label is the engine's verdict on the raw values actually stated
        expected = source_label if condition != "incomplete_undeterminable" else "Unable to determine"
        if result.label != expected:
            continue  # cannot happen if class search is right; never publish a mismatch
        vignette = render_vignette(system, known, rng, units=units)
        question = (
            f"Based on the case description, does the patient {criterion.question} "
            f"according to the {system.name}?"
        )
        case_id = (
            f"{system.id}-{criterion.id}-{condition}-{source_label.replace(' ', '_').lower()}-{index:05d}"
        )
        return DeterminabilityCase(
            case_id=case_id,
            system_id=system.id,
            system_name=system.name,
            system_version=system.version,
            criterion_id=criterion.id,
            criterion_label=criterion.label,
            criterion_rule=criterion.describe(),
            condition=condition,
            label=result.label,  # type: ignore[arg-type]
            source_label=source_label,  # type: ignore[arg-type]
            findings_json=canonical_json(known),
            removed=sorted(removed, key=cs.input_ids.index),
            s_min=ev.s_min,
            s_max=ev.s_max,
            reachable=ev.reachable,
            completions_met=result.completions_met,
            completions_not_met=result.completions_not_met,
            witness_met_json=canonical_json(result.witness_met) if result.witness_met is not None else None,
            witness_not_met_json=(
                canonical_json(result.witness_not_met) if result.witness_not_met is not None else None
            ),
            vignette=vignette,
            question=question,
            seed=seed,
            generator_version=GENERATOR_VERSION,
        )
    return None


def determinable_witnesses(
    system: ScoringSystem, crit: Criterion, label: str, cap: int = 64, budget: int = 400_000
) -> list[tuple[dict[str, int], str]] | None:
    """Exhaustive search for complete class assignments from which one finding can be removed
    while the decision stays ``label`` for every completion.

    Removing more findings only widens the reachable set, so a determinable case with label
    ``label`` exists iff some *single* removal works: an empty result is a proof of impossibility
    over every class assignment.  Returns None when the space exceeds ``budget`` evaluations.
    """
    cs = compile_system(system)
    search = _Search(cs, crit)
    ids = cs.input_ids
    sizes = [len(cs.classes[i]) for i in ids]
    space = math.prod(sizes)
    if space * len(ids) > budget:
        return None
    want = label == "Met"
    found: list[tuple[dict[str, int], str]] = []
    for i in ids:
        others = [j for j in ids if j != i]
        for combo in itertools.product(*(range(len(cs.classes[j])) for j in others)):
            cls = dict(zip(others, combo, strict=True))
            ok = True
            for c in range(len(cs.classes[i])):
                cls[i] = c
                if search.holds(search.total(cls)) != want:
                    ok = False
                    break
            if ok:
                found.append((dict(cls), i))
                if len(found) >= cap:
                    return found
    return found


def class_space(system: ScoringSystem) -> int:
    cs = compile_system(system)
    return math.prod(len(cs.classes[i]) for i in cs.input_ids)


def _split(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def generate_system_cases(
    system: ScoringSystem,
    per_condition: int,
    seed: int,
    criteria: Iterable[str] | None = None,
    units: Units = "us",
) -> tuple[list[DeterminabilityCase], list[Shortfall]]:
    """``per_condition`` cases for each of the three conditions, spread over criteria and labels."""
    crits = [c for c in system.criteria if criteria is None or c.id in set(criteria)]
    cases: list[DeterminabilityCase] = []
    shortfalls: list[Shortfall] = []
    for condition in CONDITIONS:
        given = {"Met": 0, "Not met": 0}
        for crit, n_crit in zip(crits, _split(per_condition, len(crits)), strict=True):
            # an odd count's extra case goes to the label that has fewer so far: balanced overall
            first = "Met" if given["Met"] <= given["Not met"] else "Not met"
            second = "Not met" if first == "Met" else "Met"
            for source_label, n in zip((first, second), _split(n_crit, 2), strict=True):
                given[source_label] += n
                built = 0
                misses = 0
                index = 0
                # a slice that fails repeatedly at the start is infeasible or nearly so
                while built < n and misses < max(3, n // 2 + 1):
                    case = build_case(system, crit, condition, source_label, index, seed, units=units)
                    index += 1
                    if case is None:
                        misses += 1
                        continue
                    cases.append(case)
                    built += 1
                reason = None
                if built < n and condition == "incomplete_determinable":
                    wit = determinable_witnesses(system, crit, source_label)
                    if wit:
                        rng = random.Random(sub_seed(seed, system.id, crit.id, "witness", source_label))
                        while built < n:
                            case = build_case(
                                system,
                                crit,
                                condition,
                                source_label,
                                index,
                                seed,
                                start=rng.choice(wit),
                                units=units,
                            )
                            index += 1
                            if case is not None:
                                cases.append(case)
                                built += 1
                    elif wit == []:
                        reason = (
                            f"impossible, proved by exhaustive enumeration of all "
                            f"{class_space(system)} class assignments: no finding can be left out "
                            f"while every completion stays '{source_label}' for '{crit.describe()}'"
                        )
                if built < n:
                    shortfalls.append(
                        Shortfall(
                            system.id,
                            crit.id,
                            condition,
                            source_label,
                            n,
                            built,
                            reason or _explain(system, crit, condition, source_label),
                        )
                    )
    return cases, shortfalls


def _explain(system: ScoringSystem, crit: Criterion, condition: str, source_label: str) -> str:
    if condition == "incomplete_determinable":
        return (
            f"no complete '{source_label}' case found where removing a finding keeps '{crit.describe()}' "
            f"decided for every completion (e.g. a threshold of one point leaves no slack); "
            f"searched, not proved impossible"
        )
    if condition == "incomplete_undeterminable":
        return f"no removal from a '{source_label}' case made both sides reachable; searched"
    return f"no complete case on the '{source_label}' side of '{crit.describe()}' was found; searched"
