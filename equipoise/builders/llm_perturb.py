"""LLM gold-context removal through any OpenAI-compatible endpoint, cached by content hash.

The model returns a structured edit (key facts, the removed fact, a rationale, the edited question).
The edit is checked before use by :func:`equipoise.builders.edits.check_edit` (not a no-op, the
removed text not still there verbatim, some word of the original gone); a paraphrased removed fact is
accepted, since models rarely quote the span they drop.  An edit read back from the cache passes the
same check, so a cached no-op can never turn NAP into a copy of NA. Every accepted edit is written
to a cache file named by the sha256 of (model, prompt template hash, question, options, answer), so
a rebuild never calls the model again and a rebuild on another machine with the cache folder is
byte-identical. API keys are read from the environment by the client and never stored.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from equipoise.builders.edits import check_edit
from equipoise.builders.prompts import get_template
from equipoise.schemas.clindet import canonical_json
from equipoise.schemas.items import LLMEdit, MCQItem

RESPONSE_SCHEMA = {
    "name": "context_removal",
    "strict": True,
    "schema": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "key_facts": {"type": "array", "items": {"type": "string"}},
            "removed_fact": {"type": "string"},
            "rationale": {"type": "string"},
            "edited_question": {"type": "string"},
        },
        "required": ["key_facts", "removed_fact", "rationale", "edited_question"],
    },
}


class PerturbationError(ValueError):
    """The model's reply cannot be used for this item (names the item and what is wrong)."""


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key_facts: list[str] = Field(min_length=1)
    removed_fact: str = Field(min_length=3)
    rationale: str = Field(min_length=3)
    edited_question: str = Field(min_length=10)


def endpoint_kind(base_url: str | None) -> str:
    """A coarse, key-free description of the endpoint for provenance."""
    if not base_url:
        return "openai"
    host = urlparse(base_url).hostname or ""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "local-openai-compatible"
    return "openai-compatible"


class LLMContextRemover:
    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        cache_dir: Path = Path(".equipoise-cache/llm-edits"),
        timeout: float = 60.0,
        max_retries: int = 3,
        api_key_env: str = "OPENAI_API_KEY",
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.cache_dir = Path(cache_dir)
        self.timeout = timeout
        self.max_retries = max_retries
        self.api_key_env = api_key_env
        self.template = get_template("remove_key_context")
        self.calls = 0
        self._client = None

    def _get_client(self):  # lazily, so cached rebuilds need no endpoint at all
        if self._client is None:
            from openai import OpenAI

            key = os.environ.get(self.api_key_env) or "not-needed-for-local-endpoints"
            self._client = OpenAI(
                api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=self.max_retries
            )
        return self._client

    def cache_key(self, item: MCQItem) -> str:
        payload = {
            "model": self.model,
            "template": self.template.sha256,
            "question": item.question,
            "options": [o.text for o in item.options],
            "answer": item.target.text,
        }
        return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()

    def edit(self, item: MCQItem) -> LLMEdit:
        key = self.cache_key(item)
        path = self.cache_dir / key[:2] / f"{key}.json"
        if path.exists():
            try:
                cached = LLMEdit.model_validate_json(path.read_text(encoding="utf-8"))
            except ValidationError as exc:
                raise PerturbationError(
                    f"{item.item_id}: cached edit {path} is damaged ({exc.errors()[0]['msg']})"
                ) from exc
            problem = check_edit(item.question, cached.edited_question, cached.removed_fact)
            if problem:
                raise PerturbationError(f"{item.item_id}: cached edit {path} rejected: {problem}")
            return cached
        messages = self.template.render(
            question=item.question,
            options="\n".join(f"{o.label}. {o.text}" for o in item.options),
            answer=f"{item.target.label}. {item.target.text}",
        )
        self.calls += 1
        try:
            resp = self._get_client().chat.completions.create(
                model=self.model,
                messages=messages,
                temperature=0,
                response_format={"type": "json_schema", "json_schema": RESPONSE_SCHEMA},
            )
            content = resp.choices[0].message.content
        except Exception as exc:  # openai raises many subclasses; report them per item
            raise PerturbationError(f"{item.item_id}: request failed: {type(exc).__name__}: {exc}") from exc
        reply = self._parse(item, content)
        edit = LLMEdit(
            model=self.model,
            endpoint_kind=endpoint_kind(self.base_url),
            prompt_sha256=self.template.sha256,
            key_facts=reply.key_facts,
            removed_fact=reply.removed_fact,
            rationale=reply.rationale,
            original_question=item.question,
            edited_question=reply.edited_question.strip(),
            cache_key=key,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(edit.model_dump_json(), encoding="utf-8")
        tmp.replace(path)  # atomic: a crash never leaves a half-written cache entry
        return edit

    @staticmethod
    def _parse(item: MCQItem, content: str | None) -> _Reply:
        if not content:
            raise PerturbationError(f"{item.item_id}: empty reply")
        try:
            raw = json.loads(content)
        except json.JSONDecodeError as exc:
            raise PerturbationError(f"{item.item_id}: reply is not JSON ({exc.msg})") from exc
        try:
            reply = _Reply.model_validate(raw)
        except ValidationError as exc:
            e = exc.errors()[0]
            raise PerturbationError(
                f"{item.item_id}: reply field '{'.'.join(map(str, e['loc']))}': {e['msg']}"
            ) from exc
        problem = check_edit(item.question, reply.edited_question, reply.removed_fact)
        if problem:
            raise PerturbationError(f"{item.item_id}: {problem}")
        return reply
