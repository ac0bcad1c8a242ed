"""Turn pydantic validation errors into Problems a user can act on.

Each problem names the field path (with its line in the file), the value
given, and what is allowed: the valid keys for an unknown key (with a
close-match suggestion), the choices for an enum, the field's description
for a pattern.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from clusterctl.config.yamlload import FieldPath, Located, format_path
from clusterctl.errors import MISSING, OMIT, ConfigError, Problem

M = TypeVar("M", bound=BaseModel)


def validate_located(model: type[M], located: Located, data: Any = None) -> M:
    """Validate `data` (default: `located.data`) as `model`; every failure becomes one Problem."""
    data = located.data if data is None else data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            located.source, [Problem("", data, "expected a mapping of fields (key: value lines)", 1)]
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [located.locate(_problem(model, err)) for err in exc.errors(include_url=False)]
        raise ConfigError(located.source, _dedupe(problems)) from None


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        key = (p.path, p.allowed)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _problem(model: type[BaseModel], err: dict[str, Any]) -> Problem:
    loc: FieldPath = tuple(p for p in err["loc"] if not _is_union_tag(p))
    kind = err["type"]
    value = err.get("input", MISSING)
    ctx = err.get("ctx") or {}
    path = format_path(loc)
    info = _field_at(model, loc)
    if kind == "missing":
        return Problem(path, MISSING, "this field is required" + _described(info))
    if kind == "extra_forbidden":
        keys = _keys_at(model, loc[:-1])
        hint = ""
        close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        if close:
            hint = f"did you mean '{close[0]}'? "
        return Problem(path, OMIT, f"unknown key; {hint}valid keys here: {', '.join(keys)}")
    if kind == "literal_error":
        return Problem(path, value, f"expected one of {_choices(ctx.get('expected', ''))}")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return Problem(path, value, f"expected a number {_bound(kind, ctx)}")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return Problem(path, value, "expected a whole number" + _described(info))
    if kind == "string_pattern_mismatch":
        wanted = info.description if info is not None and info.description else f"a string matching {ctx.get('pattern')}"
        return Problem(path, value, f"expected {wanted}")
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return Problem(path, value, "expected a mapping (key: value lines)" + _described(info))
    if kind in ("list_type", "tuple_type"):
        return Problem(path, value, "expected a list" + _described(info))
    if kind == "string_type":
        return Problem(path, value, "expected text" + _described(info))
    if kind in ("too_short", "string_too_short"):
        least = ctx.get("min_length", 1)
        what = "character" if kind == "string_too_short" else "item"
        return Problem(path, value, f"expected at least {least} {what}{'s' if least != 1 else ''}" + _described(info))
    if kind == "bool_type" or kind == "bool_parsing":
        return Problem(path, value, "expected true or false" + _described(info))
    if kind == "value_error":
        message = str(err["msg"]).removeprefix("Value error, ")
        is_model_rule = isinstance(value, dict)
        return Problem(path, OMIT if is_model_rule else value, message)
    return Problem(path, value, str(err["msg"]) or "invalid")


_TAG = re.compile(
    r"^(list|dict|tuple|set|frozenset|literal|nullable|union|tagged-union|chain|json-or-python|lax-or-strict"
    r"|is-instance|definition-ref|constrained-\w+|function-(after|before|plain|wrap))\[.*\]$"
)


def _is_union_tag(part: Any) -> bool:
    # pydantic adds the member type of a union to the location, e.g. 'list[str]'; a user's key
    # with a bracket in it (`o[ptimizer`, a typo) is no tag.
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "[key]"} or _TAG.match(part) is not None)


def _choices(expected: str) -> str:
    return expected.replace("'", "").replace(" or ", ", ")


def _bound(kind: str, ctx: dict[str, Any]) -> str:
    words = {
        "greater_than": ("greater than", "gt"),
        "greater_than_equal": ("at least", "ge"),
        "less_than": ("less than", "lt"),
        "less_than_equal": ("at most", "le"),
    }
    text, key = words[kind]
    return f"{text} {ctx.get(key)}"


def _described(info: FieldInfo | None) -> str:
    """The field's description after what is expected; set off with a colon where it holds parentheses itself."""
    if info is None or not info.description:
        return ""
    return f": {info.description}" if "(" in info.description else f" ({info.description})"


def _unwrap(annotation: Any) -> list[Any]:
    """The types an annotation may hold, looking through Optional, Annotated, list, dict, tuple."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out += _unwrap(arg)
        return out
    return [annotation]


def _step(annotation: Any, part: str | int) -> tuple[Any, FieldInfo | None] | None:
    for candidate in _unwrap(annotation):
        origin = typing.get_origin(candidate)
        if isinstance(part, int) and origin in (list, tuple):
            return typing.get_args(candidate)[0], None
        if origin is dict and isinstance(part, str):
            return typing.get_args(candidate)[1], None
        if isinstance(candidate, type) and issubclass(candidate, BaseModel) and isinstance(part, str):
            for name, info in candidate.model_fields.items():
                if part in (name, info.alias):
                    return info.annotation, info
    return None


def _field_at(model: type[BaseModel], loc: FieldPath) -> FieldInfo | None:
    annotation: Any = model
    info: FieldInfo | None = None
    for part in loc:
        stepped = _step(annotation, part)
        if stepped is None:
            return None
        annotation, new_info = stepped
        info = new_info or info
    return info


def _keys_at(model: type[BaseModel], loc: FieldPath) -> list[str]:
    annotation: Any = model
    for part in loc:
        stepped = _step(annotation, part)
        if stepped is None:
            return []
        annotation = stepped[0]
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return [info.alias or name for name, info in candidate.model_fields.items()]
    return []
