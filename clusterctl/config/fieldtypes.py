"""The job spec's and the site config's field types: numbers, durations, names and text a script may carry.

Each type says what it accepts and how the schema describes it; the spec
(config/spec.py) and the site (config/site.py) build their sections from
them, so one name means one rule in both.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator, WithJsonSchema

from clusterctl.syntax.units import parse_count, parse_duration

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]

_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "integer", "exclusiveMinimum": 0},
        {"type": "string", "pattern": r"^(\d+(\.\d+)?[smhd]|(\d+-)?\d+(:\d+){0,2})$"},
    ],
    "description": "seconds, or a duration such as 90s, 15m, 4h, 1-00:00:00",
}

Seconds = Annotated[int, PlainValidator(parse_duration), WithJsonSchema(_DURATION_SCHEMA)]
"""A duration in seconds; bare numbers are seconds."""

SlurmMinutes = Annotated[
    int,
    PlainValidator(lambda v: parse_duration(v, bare_unit=60)),
    WithJsonSchema({**_DURATION_SCHEMA, "description": "Slurm time: minutes, or 4h, 1-00:00:00, HH:MM:SS"}),
]
"""A Slurm-style duration in seconds; bare numbers are minutes, as in sbatch."""

ParamCount = Annotated[
    int,
    PlainValidator(parse_count),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^\d+(\.\d+)?\s*[kKmMbBtT]?$"}],
            "description": "parameter count: 7000000000, 7B, 350M",
        }
    ),
]

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SLURM_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MODULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+/@-]*$")
HOST_EXPR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,\[\]-]*$")


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        text = str(value)
        if "\x00" in text:
            raise ValueError("expected a string without NUL bytes")
        return text
    raise ValueError("expected a string, number or boolean")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _script_text(value: Any) -> Any:
    # bash drops a NUL from a word, so the rank would run something other than run.json records.
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("expected text without NUL bytes (a shell word cannot carry one)")
    return value


def _plain_path(value: Any) -> Any:
    if isinstance(value, str):
        bad = _CONTROL.search(value)
        if bad:
            raise ValueError(f"expected a path without control characters (found {bad.group()!r})")
        if not value.strip():
            raise ValueError("expected a non-empty path (omit the field for the default)")
    return value


ScriptText = Annotated[str, AfterValidator(_script_text)]
"""Text that reaches a rendered script: any character a shell word can carry."""
PlainPath = Annotated[str, AfterValidator(_plain_path)]
GroupName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")]  # a Unix group, as groupadd takes it
RunsMode = Literal["private", "group"]
RUNS_MODE_DESCRIPTION = ("who may read the run directory and checkpoints: `private` (the owner only: 0700/0600)"
                         " or `group` (read-only for `runs_group` too: 2750/0640)")
"""A directory path: no control characters (they reach #SBATCH lines and file names)."""

EnvValue = Annotated[str, PlainValidator(_env_value), WithJsonSchema({"type": ["string", "number", "boolean"]})]
EnvName = Annotated[str, Field(pattern=ENV_NAME.pattern)]
ENV_DESCRIPTION = (
    "environment variables (NAME: value); a NAME is an environment variable name: letters, digits and _,"
    " not starting with a digit"
)
