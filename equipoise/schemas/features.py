"""Derive Arrow / ``datasets.Features`` from pydantic models, so column types are written once.

Scalars, literals, optionals, nested models (structs) and lists of either are mapped; a dict-valued
field is not (store canonical JSON in a ``*_json`` string instead), because Arrow struct keys are
fixed while dict keys are not.

pyarrow is imported by the functions that build Arrow objects, not by this module: the store
imports ``to_table`` for its writes, and a metrics pass, which reads the store and never writes
an Arrow table, should not hold pyarrow's memory (equipoise/evaluators/metrics/columns.py).
"""

from __future__ import annotations

import types
import typing
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    import pyarrow as pa


def _arrow_type(annotation: Any, where: str) -> tuple[pa.DataType, bool]:
    """Return (type, nullable) for one annotation."""
    import pyarrow as pa

    scalars = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) != 1:
            raise TypeError(f"{where}: unions other than Optional[X] are not flat: {annotation}")
        t, _ = _arrow_type(non_null[0], where)
        return t, True
    if origin is Literal:
        kinds = {type(a) for a in args}
        if kinds == {str}:
            return pa.string(), False
        if kinds == {int}:
            return pa.int64(), False
        raise TypeError(f"{where}: mixed literal {annotation}")
    if origin is list:
        inner, _ = _arrow_type(args[0], where)
        return pa.list_(inner), False
    if annotation in scalars:
        return scalars[annotation], False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct(list(arrow_schema(annotation))), False
    raise TypeError(f"{where}: cannot map {annotation!r} to an Arrow type")


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """Arrow schema for a flat pydantic model, fields in declaration order."""
    import pyarrow as pa

    fields = []
    for name, info in model.model_fields.items():
        t, nullable = _arrow_type(info.annotation, f"{model.__name__}.{name}")
        fields.append(pa.field(name, t, nullable=nullable))
    return pa.schema(fields)


def to_table(model: type[BaseModel], rows: list[BaseModel]) -> pa.Table:
    """Rows -> Arrow table with the model's schema (validated models only)."""
    import pyarrow as pa

    schema = arrow_schema(model)
    return pa.Table.from_pylist([r.model_dump(mode="python") for r in rows], schema=schema)


def hf_features(model: type[BaseModel]) -> Any:
    """``datasets.Features`` for the model (imported lazily: ``datasets`` is slow to import)."""
    from datasets import Features

    return Features.from_arrow_schema(arrow_schema(model))
