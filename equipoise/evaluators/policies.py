"""Reference policies: the floor and ceiling of every metric, run through the same code as a model.

Each policy answers an item with *text*, exactly as a model would, plus a probability per option;
the text goes through the same parser as model output and the rows land in the same store tables.
So a parser or metric bug shows up on policies whose scores are known in advance (the oracle must
score 100%).

- ``chance``: uniform over the options (seeded per item).
- ``always_answer`` (ClinDet's "always decide"): never abstains. Determinability: the side more
  completions of the missing findings reach. MCQ: the gold when present, else a distractor.
- ``always_abstain``: the abstain option (or NOTA, or an explicit refusal when there is none).
- ``impute_normal`` (determinability only): unstated findings taken as normal, then decided --
  ClinDet's dominant error (81.6% of CoT errors were imputation of missing information).
- ``oracle``: the proved label / the item's target.
- ``calibrated``: a simulated model that is calibrated *by construction*, so calibration, selective
  prediction and conformal metrics have a non-degenerate reference with a known answer. Per item it
  draws a probability vector q (softmax of Gaussian logits, seeded by the item), then places the
  item's target on position j with probability q_j and the other labels on the remaining positions
  at random. So P(target = o | q) = q_o exactly: the confidence of any option is its true chance of
  being right, and ECE is zero in expectation. Sample 0 answers with the most probable option (the
  greedy answer); further samples are draws from q (the sampled answers of seed 002 appendix G).

Zero-probability options are stored with the log-probability floor ``LOG_FLOOR`` (documented, so a
one-hot policy still has finite scores for SQL softmax).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from equipoise.builders.clindet import sub_seed
from equipoise.evaluators.backends.base import GenerationRequest, GenerationResult, Sample
from equipoise.evaluators.parsing import DECISION
from equipoise.schemas.clindet import DeterminabilityCase
from equipoise.schemas.items import MCQItem
from equipoise.scoring_systems.engine import evaluate
from equipoise.scoring_systems.loader import get_system

LOG_FLOOR = math.log(1e-12)
Record = MCQItem | DeterminabilityCase


@dataclass(frozen=True)
class PolicyResponse:
    text: str
    probs: dict[str, float]


def _one_hot(labels: Iterable[str], label: str, why: str) -> PolicyResponse:
    return PolicyResponse(f"{why}\nAnswer: {label}", {lab: float(lab == label) for lab in labels})


def _labels(rec: Record) -> list[str]:
    return list(DECISION) if isinstance(rec, DeterminabilityCase) else [o.label for o in rec.options]


def chance(rec: Record, seed: int, sample: int = 0) -> PolicyResponse:
    key = rec.case_id if isinstance(rec, DeterminabilityCase) else rec.item_id
    labels = _labels(rec)
    label = random.Random(sub_seed("chance", seed, key, sample)).choice(labels)
    return PolicyResponse(f"Answer: {label}", {lab: 1 / len(labels) for lab in labels})


def always_abstain(rec: Record, seed: int, sample: int = 0) -> PolicyResponse:
    if isinstance(rec, DeterminabilityCase):
        return _one_hot(DECISION, "Unable to determine", "Policy: always abstain.")
    for role in ("abstain", "nota"):
        opt = next((o for o in rec.options if o.role == role), None)
        if opt is not None:
            return _one_hot(_labels(rec), opt.label, "Policy: always abstain.")
    return PolicyResponse("I abstain from answering this question.", {lab: 0.0 for lab in _labels(rec)})


def always_answer(rec: Record, seed: int, sample: int = 0) -> PolicyResponse:
    if isinstance(rec, DeterminabilityCase):
        met, not_met = rec.completions_met, rec.completions_not_met
        p_met = met / (met + not_met)
        label = "Met" if p_met >= 0.5 else "Not met"
        return PolicyResponse(
            f"Policy: majority of completions ({met} met, {not_met} not met).\nAnswer: {label}",
            {"Met": p_met, "Not met": 1 - p_met, "Unable to determine": 0.0},
        )
    gold = next((o for o in rec.options if o.role == "gold"), None)
    if gold is not None:
        return _one_hot(_labels(rec), gold.label, "Policy: always answer.")
    dis = [o.label for o in rec.options if o.role == "distractor"]
    pick = random.Random(sub_seed("always_answer", seed, rec.item_id, sample)).choice(dis)
    return PolicyResponse(
        f"Policy: always answer.\nAnswer: {pick}",
        {lab: (1 / len(dis) if lab in dis else 0.0) for lab in _labels(rec)},
    )


def impute_normal(rec: Record, seed: int, sample: int = 0) -> PolicyResponse:
    if not isinstance(rec, DeterminabilityCase):
        raise TypeError("impute_normal applies to determinability cases only")
    system = get_system(rec.system_id)
    findings = dict(rec.findings)
    for inp in system.inputs:
        findings.setdefault(inp.id, inp.normal)
    ev = evaluate(system, findings)
    return _one_hot(
        DECISION,
        ev.label(rec.criterion_id),
        f"Policy: unstated findings taken as normal; total {ev.total:g}.",
    )


def oracle(rec: Record, seed: int, sample: int = 0) -> PolicyResponse:
    if isinstance(rec, DeterminabilityCase):
        ev = evaluate(get_system(rec.system_id), rec.findings)
        return _one_hot(
            DECISION, ev.label(rec.criterion_id), f"Policy: exact range {ev.s_min:g}..{ev.s_max:g}."
        )
    return _one_hot(_labels(rec), rec.target_label, "Policy: oracle.")


CALIBRATED_LOGIT_SD = 1.6  # spread of the simulated logits: max probabilities range over ~0.3-0.99


def calibrated(rec: Record, seed: int, sample: int = 0) -> PolicyResponse:
    if isinstance(rec, DeterminabilityCase):
        key, target = rec.case_id, rec.label
    else:
        key, target = rec.item_id, rec.target_label
    labels = _labels(rec)
    rng = random.Random(sub_seed("calibrated", seed, key))
    logits = [rng.gauss(0.0, CALIBRATED_LOGIT_SD) for _ in labels]
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    total = sum(weights)
    q = [w / total for w in weights]
    # the target sits on position j with probability q_j; the other labels fill the rest at random
    j = rng.choices(range(len(q)), weights=q)[0]
    others = [lab for lab in labels if lab != target]
    rng.shuffle(others)
    order = [*others[:j], target, *others[j:]]
    probs = dict(zip(order, q, strict=True))
    if sample == 0:
        label = order[max(range(len(q)), key=q.__getitem__)]
    else:
        label = random.Random(sub_seed("calibrated-sample", seed, key, sample)).choices(order, weights=q)[0]
    return PolicyResponse(f"Policy: simulated calibrated model.\nAnswer: {label}", probs)


POLICIES: dict[str, Callable[[Record, int, int], PolicyResponse]] = {
    "chance": chance,
    "always_answer": always_answer,
    "always_abstain": always_abstain,
    "impute_normal": impute_normal,
    "oracle": oracle,
    "calibrated": calibrated,
}
ALIASES = {"always_decide": "always_answer"}


def policies_for(task: str) -> list[str]:
    return [p for p in POLICIES if not (p == "impute_normal" and task != "determinability")]


class ReferenceBackend:
    """A backend whose 'model' is a reference policy: it answers from the item record itself."""

    name = "reference"

    def __init__(self, policy: str, records: dict[str, Record], seed: int = 0) -> None:
        self.model = self.model_name(policy)
        self.policy = ALIASES.get(policy, policy)
        self.records = records
        self.seed = seed

    @staticmethod
    def model_name(policy: str) -> str:
        """The store's model name for a policy (planning needs it without building the backend)."""
        policy = ALIASES.get(policy, policy)
        if policy not in POLICIES:
            raise KeyError(f"unknown reference policy '{policy}'; known: {sorted(POLICIES)}")
        return f"reference:{policy}"

    def generate(self, requests: Iterable[GenerationRequest]) -> Iterator[GenerationResult]:
        fn = POLICIES[self.policy]
        for req in requests:
            rec = self.records[req.request_id]
            samples = []
            for s in range(req.decoding.n):
                r = fn(rec, self.seed, s)
                samples.append(
                    Sample(
                        index=s,
                        text=r.text,
                        finish_reason="stop",
                        option_logprobs={
                            k: (math.log(v) if v > 0 else LOG_FLOOR) for k, v in r.probs.items()
                        },
                    )
                )
            yield GenerationResult(request_id=req.request_id, samples=samples, latency_ms=0.0)
