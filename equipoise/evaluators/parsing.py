"""Parse a model's free text into one of a task's answer labels, recording how it was parsed.

Unparseable output is a first-class outcome (label ``None``, method ``"unparsed"``): it is stored and
counted, never silently scored as a wrong answer.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

DECISION = ("Met", "Not met", "Unable to determine")
_SYNONYMS = {
    "unable to determine": "Unable to determine",
    "cannot be determined": "Unable to determine",
    "cannot determine": "Unable to determine",
    "undeterminable": "Unable to determine",
    "indeterminate": "Unable to determine",
    "not met": "Not met",
    "met": "Met",
}


@dataclass(frozen=True)
class Parsed:
    label: str | None
    # answer_line | bracket | whole_reply | last_mention | option_text | leading_word | refusal
    # | llm_fallback | llm_fallback_failed | unparsed (the runner adds 'error')
    method: str


def _norm(fragment: str, labels: tuple[str, ...]) -> str | None:
    f = re.sub(r"[\s\*\"'`“”‘’.:!]+", " ", fragment).strip().lower()
    for lab in sorted(labels, key=len, reverse=True):
        if f == lab.lower():
            return lab
    if labels == DECISION and f in _SYNONYMS:
        return _SYNONYMS[f]
    return None


def _mentions(text: str, labels: tuple[str, ...]) -> list[tuple[int, str]]:
    """(position, label) of every label mention; longer labels shadow shorter ones inside them."""
    low = text.lower()
    hits: list[tuple[int, int, str]] = []
    vocab = dict.fromkeys(lab.lower() for lab in labels)
    if labels == DECISION:
        vocab.update({k: None for k in _SYNONYMS})
    for phrase in sorted(vocab, key=len, reverse=True):
        for m in re.finditer(r"(?<![a-z])" + re.escape(phrase) + r"(?![a-z])", low):
            if any(a <= m.start() < b for a, b, _ in hits):
                continue
            lab = _SYNONYMS.get(phrase) if labels == DECISION else None
            lab = lab or next(x for x in labels if x.lower() == phrase)
            hits.append((m.start(), m.end(), lab))
    return sorted((a, lab) for a, _, lab in hits)


def parse_label(text: str, labels: tuple[str, ...] = DECISION, key: str = "answer") -> Parsed:
    """Parse ``text``: an 'Answer: X' line wins, then '[X]', a bare reply, then the last mention."""
    if not text or not text.strip():
        return Parsed(None, "unparsed")
    keys = r"(?:answer|final answer|final judgment|judgment|decision|verdict)" if key else key
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.search(keys + r"\s*[:：\-]\s*(.+)$", ln, flags=re.IGNORECASE)
        if m:
            lab = _norm(m.group(1), labels)
            if lab is None:
                found = _mentions(m.group(1), labels)
                lab = found[0][1] if len({x for _, x in found}) == 1 else None
            if lab is not None:
                return Parsed(lab, "answer_line")
    br = re.findall(r"\[([^\[\]]{1,40})\]", text)
    for frag in reversed(br):
        lab = _norm(frag, labels)
        if lab:
            return Parsed(lab, "bracket")
    lab = _norm(text, labels)
    if lab:
        return Parsed(lab, "whole_reply")
    found = _mentions(lines[-1], labels)
    if found and len({x for _, x in found}) == 1:
        return Parsed(found[-1][1], "last_mention")
    return Parsed(None, "unparsed")


# ---------------------------------------------------------------------------------------------
# Letter answers (MCQ) and explicit refusals
# ---------------------------------------------------------------------------------------------
_REFUSAL = re.compile(
    r"\b(i\s+(?:cannot|can't|can not|won't|will not|am unable to|am not able to)\s+"
    r"(?:answer|help|provide|determine|choose|select)|i\s+(?:abstain|decline))\b",
    re.IGNORECASE,
)
_KEYS = r"(?:final answer|answer|final choice|choice|option)"


def _letter(fragment: str, labels: tuple[str, ...]) -> str | None:
    """'C', '(C)', 'C.', 'C) text', '**C**' -> 'C' when C is one of the labels (uppercase only)."""
    m = re.match(r"^[\s\*\"'`(\[]*([A-Z])(?:[\s\*\"'`)\].:,]|$)", fragment)
    return m.group(1) if m and m.group(1) in labels else None


def parse_choice(text: str, labels: tuple[str, ...], option_texts: dict[str, str] | None = None) -> Parsed:
    """Parse a multiple-choice reply into one of ``labels`` (letters).

    Order: an 'Answer: X' line (last one wins), a bracketed '[X]' (last), a bare letter reply, a reply
    equal to one option's text. An explicit refusal ('I cannot answer ...') is reported as method
    'refusal' with no label, so it can be counted as an abstention rather than a wrong answer.
    """
    if not text or not text.strip():
        return Parsed(None, "unparsed")
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.search(_KEYS + r"\s*(?:is)?\s*[:：\-]?\s*(.+)$", ln, flags=re.IGNORECASE)
        if m and re.search(_KEYS + r"\s*(?:is)?\s*[:：\-]", ln, flags=re.IGNORECASE):
            lab = _letter(m.group(1), labels)
            if lab:
                return Parsed(lab, "answer_line")
    for frag in reversed(re.findall(r"\[([^\[\]]{1,3})\]", text)):
        lab = _letter(frag, labels)
        if lab:
            return Parsed(lab, "bracket")
    stripped = text.strip()
    if len(stripped) <= 4:
        lab = _letter(stripped, labels)
        if lab:
            return Parsed(lab, "whole_reply")
    if option_texts:
        norm = " ".join(stripped.lower().rstrip(".").split())
        for lab, t in option_texts.items():
            if norm == " ".join(t.lower().rstrip(".").split()):
                return Parsed(lab, "option_text")
    if _REFUSAL.search(text):
        return Parsed(None, "refusal")
    return Parsed(None, "unparsed")


def parse_answer(text: str, labels: tuple[str, ...], option_texts: dict[str, str] | None = None) -> Parsed:
    """Letters go through :func:`parse_choice`; word labels (Met / Not met / ...) through
    :func:`parse_label`, which also recognises refusals."""
    if all(len(x) == 1 and x.isupper() for x in labels):
        return parse_choice(text, labels, option_texts)
    p = parse_label(text, labels)
    if p.label is None and _REFUSAL.search(text or ""):
        return Parsed(None, "refusal")
    return p


# ---------------------------------------------------------------------------------------------
# Self-evaluation verdicts (seed 003): 'Correct' / 'Incorrect'
# ---------------------------------------------------------------------------------------------
VERDICTS = ("Correct", "Incorrect")
_VERDICT_KEYS = r"(?:final verdict|verdict|final answer|answer|judgment|judgement|evaluation|assessment)"
# "not correct", "isn't correct", "no, correct ..." say the opposite of the word they contain, so a
# fragment holding a negation is never read by mention: only an exact 'Correct'/'Incorrect' counts.
_NEGATION = re.compile(r"(?<![a-z])(?:not|no|never|neither|nor)(?![a-z])|n't", re.IGNORECASE)


def _leading_verdict(line: str) -> str | None:
    """'**Incorrect** - the total is 2' -> 'Incorrect': the first word, past markdown, is a verdict."""
    m = re.match(r"^[\s\*\"'`#>_\-]*([A-Za-z]+)(?![A-Za-z])", line)
    return _norm(m.group(1), VERDICTS) if m else None


def _verdict_in(fragment: str) -> str | None:
    """The verdict a short fragment states: exactly a label, or one unnegated label mention."""
    lab = _norm(fragment, VERDICTS) or _leading_verdict(fragment)
    if lab is not None:
        return lab
    if _NEGATION.search(fragment):
        return None
    found = {x for _, x in _mentions(fragment, VERDICTS)}
    return found.pop() if len(found) == 1 else None


def parse_verdict(text: str) -> Parsed:
    """Read a self-evaluation reply as 'Correct' / 'Incorrect', or unparsed.

    Order: the last 'Verdict: X' line (also Answer / Judgment / Evaluation / Assessment), the last
    '[X]', a reply that is only the verdict, then a verdict as the first word of the first or last line
    ('Incorrect. The score is ...'), used only when those agree. Looser readings (the last mention
    anywhere) are refused because explanations routinely say 'the answer would be correct if ...'.
    """
    if not text or not text.strip():
        return Parsed(None, "unparsed")
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.search(_VERDICT_KEYS + r"\s*[:：\-]\s*(.+)$", ln, flags=re.IGNORECASE)
        if m:
            lab = _verdict_in(m.group(1))
            if lab is not None:
                return Parsed(lab, "answer_line")
    for frag in reversed(re.findall(r"\[([^\[\]]{1,20})\]", text)):
        lab = _norm(frag, VERDICTS)
        if lab:
            return Parsed(lab, "bracket")
    lab = _norm(text, VERDICTS)
    if lab:
        return Parsed(lab, "whole_reply")
    firsts = {lab for lab in (_leading_verdict(lines[0]), _leading_verdict(lines[-1])) if lab}
    if len(firsts) == 1:
        return Parsed(firsts.pop(), "leading_word")
    return Parsed(None, "unparsed")


# ---------------------------------------------------------------------------------------------
# Optional LLM fallback: another model reads the reply when every regex failed
# ---------------------------------------------------------------------------------------------
# Kept here (not in the YAML templates) because its job is parsing, not eliciting an answer; its hash
# enters the run id of any run that uses it, so a changed wording is a different run.
FALLBACK_SYSTEM = (
    "You read a reply that someone else wrote to a question with fixed answer options and report which "
    "option the reply chose. Do not answer the question yourself and do not judge whether the reply is right."
)
FALLBACK_USER = (
    "Answer options:\n{options}\n\n"
    "The reply (between the markers):\n<<<REPLY\n{reply}\nREPLY>>>\n\n"
    "Which option did the reply give as its final answer? Write only that option's label exactly as "
    "listed ({labels}). If the reply chose no option, or more than one, write NONE."
)
FALLBACK_SHA256 = hashlib.sha256(f"{FALLBACK_SYSTEM}\n{FALLBACK_USER}".encode()).hexdigest()
FALLBACK_METHOD = "llm_fallback"
FALLBACK_FAILED = "llm_fallback_failed"
_FALLBACK_MAX_CHARS = 6000  # the final answer sits at the end of a long reasoning; keep the tail


def fallback_messages(
    raw: str, labels: tuple[str, ...], option_texts: dict[str, str] | None = None
) -> list[dict[str, str]]:
    """The chat messages asking a helper model which of ``labels`` the reply ``raw`` chose."""
    reply = raw if len(raw) <= _FALLBACK_MAX_CHARS else "[...] " + raw[-_FALLBACK_MAX_CHARS:]
    opts = "\n".join(
        f"{lab}. {option_texts[lab]}" if option_texts and lab in option_texts else lab for lab in labels
    )
    user = FALLBACK_USER.format(options=opts, reply=reply, labels=", ".join(labels))
    return [{"role": "system", "content": FALLBACK_SYSTEM}, {"role": "user", "content": user}]


def read_fallback_reply(reply: str, labels: tuple[str, ...]) -> str | None:
    """The label a helper's reply names, or None (NONE, an off-list label, several, chatter).

    Strict on purpose: only a reply that *is* a label (modulo markdown and punctuation), an
    'Answer: X' line or '[X]' counts. Anything looser would let the helper's own prose be misread.
    """
    reply = reply.strip().strip("*_` ")
    if labels == VERDICTS:
        p = parse_verdict(reply)
        return p.label if p.method in ("answer_line", "bracket", "whole_reply") else None
    p = parse_answer(reply, labels)
    return p.label if p.method in ("answer_line", "bracket", "whole_reply") else None
