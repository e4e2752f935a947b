"""LLM context removal through the real openai client against a local fake endpoint."""

from __future__ import annotations

import json
import re

import pytest

from equipoise.builders.llm_perturb import LLMContextRemover, PerturbationError
from equipoise.builders.suites import SuiteOptions, medabstain
from equipoise.schemas.items import LLMEdit
from tests.fakeopenai import FakeOpenAI, completion
from tests.mcq_factory import make_item


def _responder(body):
    user = body["messages"][-1]["content"]
    q = re.search(r"Question:\n(.*?)\n\nOptions:", user, re.S).group(1)
    assert body["response_format"]["type"] == "json_schema"
    if "number 3 " in q:
        return 200, completion("this is not json")
    if "number 4 " in q:
        return 200, completion(json.dumps({"key_facts": ["x"], "rationale": "r", "edited_question": q}))
    if "number 5 " in q:
        return 500, {"error": {"message": "boom"}}
    fact = re.search(r"The decisive finding number \d+ is present\.", q).group(0)
    edited = q.replace(fact, "").replace("  ", " ")
    reply = {
        "key_facts": [fact, "cough"],
        "removed_fact": fact,
        "rationale": "it decides the answer",
        "edited_question": edited,
    }
    return 200, completion(json.dumps(reply))


def test_llm_edits_are_recorded_cached_and_failures_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-never-store")
    items = [make_item(idx=i) for i in range(7)]
    with FakeOpenAI(_responder) as server:
        remover = LLMContextRemover(
            "fake-model", base_url=server.base_url, cache_dir=tmp_path / "c", max_retries=0
        )
        res = medabstain(items, SuiteOptions(seed=1, context_removal="llm", remover=remover))
        first_calls = len(server.requests)
        # rebuild: every accepted edit comes from the cache; only the failed ones are asked again
        remover2 = LLMContextRemover(
            "fake-model", base_url=server.base_url, cache_dir=tmp_path / "c", max_retries=0
        )
        res2 = medabstain(items, SuiteOptions(seed=1, context_removal="llm", remover=remover2))
        assert remover2.calls == 3 == len(server.requests) - first_calls
    failed = {f["item"] for f in res.failures}
    assert failed == {"t-0003", "t-0004", "t-0005"}
    reasons = " ".join(f["reason"] for f in res.failures)
    assert "not JSON" in reasons and "removed_fact" in reasons and "request failed" in reasons
    assert len(res.configs["NAP"]) == len(res.configs["AP"]) == 4
    assert len(res.configs["NA"]) == 7  # unperturbed variants keep every item
    nap = res.configs["NAP"][0]
    edit = nap.provenance[-1].llm_edit
    assert edit.model == "fake-model" and edit.endpoint_kind == "local-openai-compatible"
    assert len(edit.prompt_sha256) == 64 and edit.removed_fact in edit.original_question
    assert [i.model_dump() for i in res2.configs["AP"]] == [i.model_dump() for i in res.configs["AP"]]
    # AP derives from the same recorded edit as NAP
    ap = {i.base_id: i for i in res.configs["AP"]}
    for n in res.configs["NAP"]:
        assert ap[n.base_id].question == n.question
        assert ap[n.base_id].provenance[0].llm_edit == n.provenance[0].llm_edit
    # the key went out in the header, but was never written to the cache
    assert any("SECRET" in a for a in server.auth_seen)
    for f in (tmp_path / "c").rglob("*.json"):
        assert "SECRET" not in f.read_text()


def _reply(it, removed, edited):
    return json.dumps(
        {"key_facts": ["a"], "removed_fact": removed, "rationale": "it decides", "edited_question": edited}
    )


def test_parse_rejects_no_ops_and_edits_that_keep_the_fact():
    it = make_item(idx=9)
    fact = it.metadata.key_fact
    with pytest.raises(PerturbationError, match="no-op"):
        LLMContextRemover._parse(it, _reply(it, fact, it.question))
    with pytest.raises(PerturbationError, match="no-op"):  # only layout changed
        LLMContextRemover._parse(it, _reply(it, fact, "  " + it.question.upper().replace(" ", "   ")))
    kept = it.question.replace("with a cough", "")
    with pytest.raises(PerturbationError, match="still contains"):
        LLMContextRemover._parse(it, _reply(it, fact, kept))
    reworded = it.question.replace("presents with", "with presents")  # same words, moved
    with pytest.raises(PerturbationError, match="drops no word"):
        LLMContextRemover._parse(it, _reply(it, "the finding, in other words", reworded))


def test_parse_accepts_a_paraphrased_removed_fact():
    """Models (and the MedAbstain release) describe what they removed in their own words: the removed
    fact need not be a span of the question, as long as the edit really removes something."""
    it = make_item(idx=9)
    edited = it.question.replace(it.metadata.key_fact, "").replace("  ", " ")
    reply = LLMContextRemover._parse(it, _reply(it, "the decisive finding (no. 9) was there", edited))
    assert reply.edited_question == edited


def test_cached_no_op_edit_is_rejected(tmp_path):
    """A cache entry that would make NAP a copy of NA is refused on read, not silently used."""
    it = make_item(idx=2)
    remover = LLMContextRemover("fake-model", base_url="http://127.0.0.1:9/v1", cache_dir=tmp_path)
    key = remover.cache_key(it)
    path = tmp_path / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True)
    bad = LLMEdit(
        model="fake-model",
        endpoint_kind="local-openai-compatible",
        prompt_sha256=remover.template.sha256,
        key_facts=["x"],
        removed_fact=it.metadata.key_fact,
        rationale="r",
        original_question=it.question,
        edited_question=it.question,
        cache_key=key,
    )
    path.write_text(bad.model_dump_json(), encoding="utf-8")
    with pytest.raises(PerturbationError, match=r"cached edit .* rejected: no-op"):
        remover.edit(it)
    assert remover.calls == 0
    res = medabstain(
        [it], SuiteOptions(seed=1, context_removal="llm", remover=remover, configs=["NA", "NAP"])
    )
    assert res.configs["NAP"] == [] and "no-op" in res.failures[0]["reason"]
    assert res.dropped == [{"config": "NAP", "item": it.base_id, "reason": res.failures[0]["reason"]}]
