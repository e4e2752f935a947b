"""Render findings as a natural-language case vignette.

Design choices, each for a reason:
- raw measurements, not item names ("respiratory rate 24/min", never "tachypnoea: yes"), so a model
  must apply the cut-offs itself;
- explicit negatives for known-absent findings, so "not mentioned" and "absent" never blur — the
  whole benchmark hinges on that distinction;
- an unknown finding is simply not mentioned (and an unknown age or sex is not invented);
- non-scoring distractor findings, so the task cannot be solved by counting sentences;
- every choice comes from the caller's seeded ``random.Random``, so a rebuild is byte-identical.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Literal

from equipoise.schemas.scoring import (
    BinaryInput,
    CategoricalInput,
    NumericInput,
    ScoringSystem,
)
from equipoise.schemas.units import convert, format_number

Value = bool | str | float
Units = Literal["us", "si"]
UNIT_CONVENTIONS: tuple[str, str] = ("us", "si")

# Findings that score in *no* bundled system's inputs they mention; each lists the input ids it
# would contradict, so a system that reads one of them never receives it as a distractor.
ADULT = ("adult", "pregnant")
GLOBAL_DISTRACTORS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    # (sentence, input ids it would contradict, subjects it suits)
    ("An appendicectomy was performed in childhood.", (), ADULT),
    ("There is a seasonal allergy to grass pollen.", (), (*ADULT, "child")),
    ("The patient lives with a partner and works as a bookkeeper.", (), ("adult",)),
    ("Vaccinations are up to date.", (), (*ADULT, "child")),
    ("A first-degree relative has hypothyroidism.", (), (*ADULT, "child")),
    ("The patient drinks two cups of coffee a day.", (), ("adult",)),
    ("There is mild bilateral hearing loss.", (), ("adult",)),
    ("Reading glasses were prescribed last year.", (), ("adult",)),
    ("A small lipoma on the back has been stable for years.", (), ("adult",)),
    ("The patient recently returned from a short holiday by train.", (), ("adult",)),
    ("Skin turgor is normal.", ("dehydration",), ("adult", "child")),
    ("Pupils are equal and reactive to light.", ("gcs", "confusion"), ("adult", "child")),
    ("Serum sodium is 139 mmol/L.", ("sodium",), ADULT),
    ("Serum potassium is 4.2 mmol/L.", ("potassium",), ADULT),
    ("TSH is within the reference range.", (), ADULT),
    ("The pregnancy was followed with regular antenatal visits.", (), ("newborn", "pregnant")),
    ("Birth weight was 3.3 kg.", (), ("newborn",)),
    ("The amniotic fluid was clear.", (), ("newborn",)),
    ("The mother's blood group is A Rh-positive.", (), ("newborn",)),
    ("The child attends primary school.", (), ("child",)),
]

_CLAUSE_STARTS = {
    "has",
    "had",
    "have",
    "is",
    "was",
    "are",
    "were",
    "takes",
    "took",
    "does",
    "did",
    "reports",
    "reported",
    "denies",
    "denied",
    "uses",
    "used",
    "underwent",
    "received",
    "receives",
    "lives",
    "smokes",
    "drinks",
    "describes",
    "complains",
    "presents",
    "presented",
    "remains",
    "needs",
    "requires",
    "required",
    "cannot",
    "can",
    "opens",
    "makes",
    "withdraws",
    "moves",
    "flexes",
    "extends",
    "localises",
    "localizes",
    "obeys",
    "responds",
    "cries",
    "grimaces",
    "breathes",
    "shows",
    "showed",
    "appears",
    "appeared",
    "looks",
    "feels",
    "felt",
    "developed",
    "develops",
    "experienced",
    "experiences",
    "noticed",
    "notices",
    "gave",
    "gives",
    "keeps",
    "stays",
    "still",
    "also",
    "not",
    "never",
    "recently",
    "currently",
    "previously",
    "sustained",
    "suffered",
    "suffers",
    "passed",
    "passes",
    "fainted",
    "collapsed",
    "vomited",
    "coughs",
    "coughed",
    "weighs",
    "became",
    "becomes",
    "continues",
    "recalls",
    "lost",
    "had,",
    "walks",
}


def is_clause(phrase: str) -> bool:
    """A phrase that needs a grammatical subject ('has diabetes') vs a noun phrase ('pulse 80/min')."""
    first = phrase.strip().split(" ", 1)[0].lower()
    return first in _CLAUSE_STARTS


def format_value(inp: NumericInput, value: float) -> str:
    if inp.decimals == 0:
        return str(round(value))
    return f"{value:.{inp.decimals}f}"


def stated_text(inp: NumericInput, value: float, units: Units) -> tuple[str, str] | None:
    """(number, unit) as a vignette in the ``units`` convention states the value (converted and
    rounded to the rendering's decimals), or None when the definition's own unit is used."""
    r = inp.rendering(units)
    if r is None:
        return None
    return format_number(convert(float(value), inp.unit, r.unit, inp.quantity), r.decimals), r.unit


def _join(parts: list[str]) -> str:
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def render_finding(
    inp: BinaryInput | CategoricalInput | NumericInput,
    value: Value,
    rng: random.Random,
    units: Units = "us",
) -> str:
    """One finding as text. A value with a rendering for ``units`` (``si`` / ``us``) is stated in
    that unit; every convention draws the same random numbers, so only the stated unit differs."""
    if isinstance(inp, BinaryInput):
        return rng.choice(inp.present if value else inp.absent)
    if isinstance(inp, CategoricalInput):
        cat = next(c for c in inp.categories if c.value == value)
        return rng.choice(cat.phrases)
    assert isinstance(inp, NumericInput)
    stated = stated_text(inp, float(value), units)
    if stated is not None:
        r = inp.rendering(units)
        assert r is not None
        k = rng.randrange(len(inp.phrases))  # the same draw as rng.choice(inp.phrases) below
        return r.phrases[k % len(r.phrases)].replace("{value}", stated[0]).replace("{unit}", stated[1])
    tmpl = rng.choice(inp.phrases)
    return tmpl.replace("{value}", format_value(inp, float(value))).replace("{unit}", inp.unit)


_SECTION_LEADS = {
    "vitals": ["Vital signs: ", "On arrival the observations were ", "Observations: "],
    "labs": ["Laboratory tests showed ", "Blood tests: ", "Results available so far: "],
    "exam": ["On examination: ", "Examination findings: "],
    "imaging": ["Imaging: "],
    "symptoms": ["Symptoms: "],
    "history": ["Background: "],
    "other": ["Other findings: "],
}


_NEWBORN_LEADS = {
    "vitals": ["Assessment at one minute after birth: ", "At one minute of age: "],
    "exam": ["At one minute of age: "],
}


def render_vignette(
    system: ScoringSystem,
    findings: Mapping[str, Value],
    rng: random.Random,
    n_distractors: int = 2,
    units: Units = "us",
) -> str:
    """Compose a vignette stating exactly ``findings`` (inputs absent from it are not mentioned),
    with lab values in the ``units`` convention ('us': the definition's units; 'si': SI)."""
    v = system.vignette
    age_inp = next((i for i in system.inputs if i.demographic == "age"), None)
    sex_inp = next((i for i in system.inputs if i.demographic == "sex"), None)

    # --- opening: age and sex are stated only if known, or invented only if they never score
    if age_inp is not None:
        age: float | None = findings.get(age_inp.id)  # type: ignore[assignment]
    elif v.subject == "adult":
        age = float(rng.randint(24, 88))
    elif v.subject == "pregnant":
        age = float(rng.randint(19, 42))
    elif v.subject == "child":
        age = float(rng.randint(3, 14))
    else:
        age = None
    implied = [
        c.implies_sex
        for i in system.inputs
        if isinstance(i, CategoricalInput) and i.id in findings
        for c in i.categories
        if c.value == findings[i.id] and c.implies_sex
    ]
    if sex_inp is not None:
        sex = findings.get(sex_inp.id)
    elif v.subject == "pregnant":
        sex = "female"
    elif implied:
        sex = implied[0]
    else:
        sex = rng.choice(["male", "female"])
    if v.subject == "newborn":
        noun = {"male": "newborn boy", "female": "newborn girl"}.get(str(sex), "newborn")
    elif v.subject == "child" or (age is not None and age < 16 and v.subject != "pregnant"):
        noun = {"male": "boy", "female": "girl"}.get(str(sex), "child")
    else:
        noun = {"male": "man", "female": "woman"}.get(str(sex), "patient")
    if age is not None:
        age_txt = format_value(age_inp, age) if isinstance(age_inp, NumericInput) else str(int(age))
        opener = f"{age_txt}-year-old {noun}"
        article = "An" if age_txt[0] == "8" or age_txt in ("11", "18") else "A"
        opener = f"{article} {opener}"
    else:
        opener = f"{'An' if noun[0] in 'aeiou' else 'A'} {noun}"
    sentences = [f"{opener} {rng.choice(v.presentations)}"]
    pronoun = {"male": "He", "female": "She"}.get(str(sex), "The patient")
    if v.subject == "newborn":
        pronoun = "The baby"

    # --- findings, grouped by section; clauses get a subject, noun phrases are listed
    clause_sents: list[str] = []
    lists: dict[str, list[str]] = {}
    for inp in system.inputs:
        if inp.demographic is not None or inp.id not in findings:
            continue
        text = render_finding(inp, findings[inp.id], rng, units)
        if is_clause(text):
            subj = rng.choice([pronoun, pronoun, "The patient"]) if v.subject != "newborn" else pronoun
            clause_sents.append(f"{subj} {text}.")
        else:
            lists.setdefault(inp.section, []).append(text)
    rng.shuffle(clause_sents)
    body = list(clause_sents)
    for section in ("history", "symptoms", "exam", "vitals", "labs", "imaging", "other"):
        items = lists.get(section)
        if not items:
            continue
        rng.shuffle(items)
        leads = _NEWBORN_LEADS if v.subject == "newborn" and section in _NEWBORN_LEADS else _SECTION_LEADS
        lead = rng.choice(leads[section])
        body.append(f"{lead}{_join(items)}.")
    # --- distractors: system-specific first, then global ones that touch none of its inputs
    read = {i.id for i in system.inputs}
    own = " ".join(v.distractors).lower()
    pool = list(v.distractors) + [
        t
        for t, touches, subjects in GLOBAL_DISTRACTORS
        if v.subject in subjects
        and not read & set(touches)
        and not any(word in own for word in touches)
        and t.split(" ")[1].lower() not in own  # e.g. a system's own 'Serum sodium ...' sentence
    ]
    for d in rng.sample(pool, k=min(n_distractors, len(pool))):
        body.insert(rng.randint(0, len(body)), d)
    return " ".join(sentences + [_cap(s) for s in body])
