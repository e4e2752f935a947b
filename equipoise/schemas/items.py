"""Multiple-choice items, their options' roles and the provenance chain of every transform.

One record type flows through the whole MCQA pipeline: a source adapter creates an ``MCQItem``,
each transform returns a new ``MCQItem`` with one more ``TransformStep`` in ``provenance``, and the
published row *is* the item (``datasets.Features`` are derived from this model by
:mod:`equipoise.schemas.features`). Options carry a stable ``option_id`` so metrics can follow an
option's identity across shuffles instead of its letter.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

OptionRole = Literal["gold", "distractor", "abstain", "nota"]
AbstainFraming = Literal["NA", "IDK", "INA", "Abstain"]
QuestionType = Literal[
    "diagnosis", "treatment", "diagnostic_test", "definition", "procedure_operation", "other"
]
QUESTION_TYPES: tuple[str, ...] = (
    "diagnosis",
    "treatment",
    "diagnostic_test",
    "definition",
    "procedure_operation",
    "other",
)

# Display text of each abstention framing (CLEAR's three plus MedAbstain's plain abstain option)
# and of the NOTA option used by the VQA stress tests.
ABSTAIN_TEXT: dict[str, str] = {
    "NA": "None of the above",
    "IDK": "I don't know",
    "INA": "I need assistance",
    "Abstain": "I abstain from answering",
}
NOTA_TEXT = "None of the options is correct"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Option(_Frozen):
    label: str = Field(pattern=r"^[A-Z]$", description="Letter shown to the model.")
    text: str = Field(min_length=1)
    role: OptionRole
    framing: AbstainFraming | None = Field(
        default=None, description="For abstain options: which framing (NA / IDK / INA / Abstain)."
    )
    option_id: str = Field(
        description="Stable identity across shuffles: source option index or 'abstain:NA' etc."
    )

    @model_validator(mode="after")
    def _framing(self) -> Option:
        if (self.role == "abstain") != (self.framing is not None):
            raise ValueError("framing is set exactly for abstain options")
        return self


class SourceRef(_Frozen):
    dataset: str = Field(description="Source dataset, e.g. 'medqa_usmle_4' or 'equipoise_mini'.")
    split: str
    source_id: str
    revision: str = Field(description="Source revision (commit, version tag or content hash).")


class ItemMetadata(_Frozen):
    specialty: str | None = None
    question_type: QuestionType | None = None
    imaging_modality: str | None = None
    difficulty: str | None = None
    exam_part: str | None = Field(
        default=None, description="Exam part the source assigns (MedQA's meta_info: step1, step2&3)."
    )
    key_fact: str | None = Field(
        default=None, description="Annotated key clinical fact: a verbatim span of the question."
    )


class LLMEdit(_Frozen):
    """The structured result of an LLM gold-context removal, kept whole for audit."""

    model: str
    endpoint_kind: str = Field(description="'openai', 'vllm-server', 'ollama', ... (never the key).")
    prompt_sha256: str
    key_facts: list[str]
    removed_fact: str
    rationale: str
    original_question: str
    edited_question: str
    cache_key: str


class TransformStep(_Frozen):
    name: str
    version: str
    params_json: str = Field(description="Canonical JSON of the transform's parameters.")
    seed: int | None = None
    removed_text: str | None = Field(default=None, description="Span removed (context removal).")
    original_question: str | None = None
    llm_edit: LLMEdit | None = None

    @property
    def params(self) -> dict:
        return json.loads(self.params_json)


class MCQItem(_Frozen):
    """A multiple-choice item in one variant, with the full record of how it was made."""

    item_id: str = Field(description="Unique within a config: base id plus variant suffixes.")
    base_id: str = Field(description="Id of the untransformed source item: pairs variants.")
    variant: str = Field(default="original", description="Variant name, e.g. 'NA', 'AP', 'k2_idk'.")
    source: SourceRef
    question: str = Field(min_length=1)
    image: str | None = Field(default=None, description="Relative image path for VQA items.")
    options: list[Option] = Field(min_length=2)
    target_label: str = Field(description="Letter of the option the item expects.")
    abstain_expected: bool = Field(
        default=False,
        description="Key information was removed: abstaining is the safe behaviour even when the "
        "target letter still names the original gold answer (MedAbstain NAP/AP).",
    )
    metadata: ItemMetadata = ItemMetadata()
    provenance: list[TransformStep] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> MCQItem:
        labels = [o.label for o in self.options]
        if labels != list(LETTERS[: len(labels)]):
            raise ValueError(f"option labels must be A, B, C, ... in order; got {labels}")
        if self.target_label not in labels:
            raise ValueError(f"target label {self.target_label!r} is not an option ({labels})")
        ids = [o.option_id for o in self.options]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate option ids {ids}")
        roles = [o.role for o in self.options]
        if roles.count("gold") > 1:
            raise ValueError("more than one gold option")
        framings = [o.framing for o in self.options if o.framing]
        if len(set(framings)) != len(framings):
            raise ValueError(f"abstain framing repeated: {framings}")
        target = self.options[labels.index(self.target_label)]
        if "gold" in roles and target.role != "gold":
            raise ValueError("when the gold answer is present it must be the target")
        if "gold" not in roles and target.role not in ("abstain", "nota"):
            raise ValueError("without a gold option the target must be an abstain or NOTA option")
        return self

    def option(self, label: str) -> Option:
        return next(o for o in self.options if o.label == label)

    @property
    def target(self) -> Option:
        return self.option(self.target_label)
