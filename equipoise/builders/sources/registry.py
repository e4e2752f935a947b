"""The registered source kinds and the one entry point that turns a ``--source`` spec into items.

Importing this module imports every bundled source module, each of which registers its kind with
:func:`equipoise.builders.sources.base.register`; a new source is a new module plus one line below.
"""

from __future__ import annotations

from equipoise.builders.sources import (  # noqa: F401  (imported for their registrations)
    generic,
    gmai_mmbench,
    medabstain,
    medexqa,
    medmcqa,
    medqa,
    pubmedqa,
)
from equipoise.builders.sources.base import REGISTRY, Loaded, SourceSpec
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import MCQItem


def load(spec: str) -> tuple[list[MCQItem], dict[str, str]]:
    """Resolve a source spec to items (in source order) and a record for the build manifest:
    ``name`` and ``revision`` always, plus kind, location, splits, item and skip counts."""
    loaded = load_full(spec)
    return loaded.items, loaded.record


def load_full(spec: str) -> Loaded:
    """As :func:`load`, with what a source carries beyond items (imported edits, abstain option)."""
    parsed = SourceSpec.parse(spec)
    kind = REGISTRY[parsed.kind]
    loaded = kind.full_loader(parsed) if kind.full_loader is not None else Loaded(*kind.loader(parsed))
    if not loaded.items:
        raise SourceError(f"{spec}: no items were read")
    return loaded
