"""Records of the ClinDet determinability suite: generated cases and their proofs.

A case is published as one flat row (every field a plain scalar, string or list of scalars) so that
``datasets.load_dataset`` reads it without custom features; structured parts (findings, witnesses)
are canonical JSON strings that :meth:`DeterminabilityCase.model_validate` re-checks on read.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Condition = Literal["complete", "incomplete_determinable", "incomplete_undeterminable"]
CONDITIONS: tuple[Condition, ...] = (
    "complete",
    "incomplete_determinable",
    "incomplete_undeterminable",
)
DecisionLabel = Literal["Met", "Not met", "Unable to determine"]


# ``json.dumps`` with non-default options builds a fresh encoder on every call; canonical JSON is
# written once per transform step, so one encoder with exactly those options is built here and
# reused (``dumps`` itself does nothing but ``JSONEncoder(**options).encode(obj)``; encoders keep no
# state between calls).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(obj: object) -> str:
    """Deterministic JSON (sorted keys, no spaces) so identical content hashes identically."""
    return _CANONICAL.encode(obj)


class DeterminabilityCase(BaseModel):
    """One clinical-decision case with its exact, proved label."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str = Field(description="Stable id: system, criterion, condition, seed-derived index.")
    system_id: str
    system_name: str
    system_version: str
    criterion_id: str
    criterion_label: str
    criterion_rule: str = Field(description="Human form of the decision rule, e.g. 'total ≥ 2'.")
    condition: Condition
    label: DecisionLabel
    source_label: Literal["Met", "Not met"] = Field(
        description="Label of the complete case this one was derived from (before removal)."
    )
    findings_json: str = Field(description="Known findings {input: value} stated in the vignette.")
    removed: list[str] = Field(description="Inputs removed from the complete case (unstated).")
    s_min: float
    s_max: float
    reachable: list[float] = Field(description="Every total some completion reaches.")
    completions_met: int = Field(ge=0, description="Class completions on the 'Met' side.")
    completions_not_met: int = Field(ge=0)
    witness_met_json: str | None = Field(description="A completion of the removed inputs that meets.")
    witness_not_met_json: str | None
    vignette: str
    question: str
    seed: int
    generator_version: str

    @model_validator(mode="after")
    def _consistent(self) -> DeterminabilityCase:
        if self.condition == "complete":
            if self.removed or self.s_min != self.s_max:
                raise ValueError("complete case must remove nothing and have S_min = S_max")
        elif not self.removed:
            raise ValueError("incomplete case must remove at least one input")
        want = {
            "Met": self.completions_not_met == 0,
            "Not met": self.completions_met == 0,
            "Unable to determine": self.completions_met > 0 and self.completions_not_met > 0,
        }
        if not want[self.label]:
            raise ValueError(
                f"label {self.label!r} contradicts the proof "
                f"(met={self.completions_met}, not met={self.completions_not_met})"
            )
        undetermined = self.label == "Unable to determine"
        if undetermined != (self.condition == "incomplete_undeterminable"):
            raise ValueError(f"label {self.label!r} does not fit condition {self.condition!r}")
        return self

    @property
    def findings(self) -> dict[str, bool | str | float]:
        return json.loads(self.findings_json)
