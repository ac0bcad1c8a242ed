"""Every field of the job spec and the site config, at any depth: type, default, allowed values, description."""

from __future__ import annotations

import enum
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from clusterctl.config.fieldtypes import Seconds, SlurmMinutes


@dataclass(frozen=True)
class FieldDoc:
    path: str  # dotted, as --set takes it; `NAME` stands for a key the user chooses (a partition's name)
    kind: str  # the type in words
    default: str  # "" when required
    allowed: str  # the literal choices, or ""
    description: str


def _models(annotation: Any) -> list[tuple[type[BaseModel], str]]:
    """The models inside an annotation, each with the path part it adds (`.NAME` for a dict's values)."""
    found: list[tuple[type[BaseModel], str]] = []
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    if origin in (dict,):
        _, value = typing.get_args(annotation)
        return [(m, ".NAME" + more) for m, more in _models(value)]
    if origin in (list, tuple):
        return [(m, "[]" + more) for arg in typing.get_args(annotation) for m, more in _models(arg)]
    for arg in typing.get_args(annotation):
        found += _models(arg)
    return found


def _kind(annotation: Any) -> str:
    """A type as a user reads it: `integer`, `duration`, `list of string`, `one of ...`, `x or null`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation == SlurmMinutes:
        return "duration (4h, 90m, 1-00:00:00; a bare number is minutes)"
    if annotation == Seconds:
        return "duration (90s, 15m, 4h; a bare number is seconds)"
    if origin is typing.Annotated:
        return _kind(args[0])
    if origin is Literal:
        return "one of the allowed values"
    if origin in (typing.Union, types.UnionType):
        parts = [_kind(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(parts)) + (" or null" if type(None) in args else "")
    if origin in (list, tuple, set, frozenset):
        return "list of " + (_kind(args[0]) if args else "values")
    if origin is dict:
        return "mapping of " + _kind(args[0]) + " to " + _kind(args[1])
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "section"
        if issubclass(annotation, enum.Enum):
            return "one of the allowed values"
        return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(annotation, annotation.__name__)
    return str(annotation)


def _annotated(info: Any) -> Any:
    """The field's annotation as written: pydantic moves a top-level Annotated's metadata to `info.metadata`."""
    for known in (SlurmMinutes, Seconds):
        if info.annotation is int and list(typing.get_args(known)[1:]) == list(info.metadata):
            return known
    return info.annotation


def _allowed(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return ", ".join(f"`{v}`" for v in typing.get_args(annotation))
    return ", ".join(filter(None, (_allowed(a) for a in typing.get_args(annotation))))


def _default(info: Any) -> str:
    if info.is_required():
        return ""
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined or isinstance(value, BaseModel):
        return ""
    return f"`{json.dumps(value, default=str)}`"  # as the YAML or JSON spec writes it: null, "local", []


def fields(model: type[BaseModel], prefix: str = "", seen: frozenset[type] = frozenset(),
           shorthands: dict[str, str] | None = None) -> list[FieldDoc]:
    """The model's fields and its sections' fields, depth first, in declaration order; `shorthands`: the forms a
    field also takes before validation (config/specschema.SHORTHANDS), by path."""
    found = []
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        kind = _kind(_annotated(info))
        if path in (shorthands or {}):
            kind = f"{(shorthands or {})[path]}, or {kind}"
        found.append(FieldDoc(path, kind, _default(info), _allowed(info.annotation),
                              " ".join((info.description or "").split())))
        for inner, more in _models(info.annotation):
            if inner not in seen:
                found += fields(inner, f"{path}{more}.", seen | {inner})
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(model: type[BaseModel], title: str, intro: str, shorthands: dict[str, str] | None = None) -> str:
    """A page: the intro, then one table row per field. The page has one heading, so the table of contents
    is hidden (front matter) and the table gets its width."""
    rows = ["| field | type | default | allowed | description |", "|---|---|---|---|---|"]
    for f in fields(model, shorthands=shorthands):
        rows.append(f"| `{f.path}` | {_cell(f.kind)} | {_cell(f.default)} | {_cell(f.allowed)} | {_cell(f.description)} |")
    return f"---\nhide:\n  - toc\n---\n\n# {title}\n\n{intro}\n\n" + "\n".join(rows) + "\n"
