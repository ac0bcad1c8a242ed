"""The published JSON Schema of job.yaml: what pydantic derives from the spec, plus the shorthands it cannot see."""

from __future__ import annotations

from typing import Any

from clusterctl.config.spec import PREFLIGHT_CHECKS, Dtype, JobSpec

# The forms a field takes besides its own before validation, in words (the field reference shows them too).
SHORTHANDS = {
    "precision": "a compute dtype alone (`precision: bf16`)",
    "preflight": "a check or a list of checks added to the defaults (`preflight: comm`)",
    "command": "a string split like a shell (`command: python3 train.py`)",
}

def json_schema() -> dict[str, Any]:
    """The published JSON Schema of job.yaml (for editors and CI checks).

    Adds what pydantic cannot see: the shorthands accepted before validation
    (`precision: bf16`, `preflight: comm`, `command: "python train.py"`).
    """
    schema = JobSpec.model_json_schema(by_alias=True)
    props = schema["properties"]
    dtypes = list(Dtype.__args__)  # type: ignore[attr-defined]
    props["precision"] = {
        "anyOf": [{"enum": dtypes, "description": "compute dtype shorthand"}, {"$ref": "#/$defs/Precision"}],
        "description": "bf16, fp16, fp32, fp8, or the dtypes of each part",
    }
    check = {"enum": list(PREFLIGHT_CHECKS)}
    props["preflight"] = {
        "anyOf": [check, {"type": "array", "items": check}, {"$ref": "#/$defs/Preflight"}],
        "description": "checks added to the defaults, or the full settings",
    }
    command = props["command"]
    props["command"] = {
        "anyOf": [{"type": "string", "minLength": 1}, *command.get("anyOf", [command])],
        "description": command.get("description", ""),
    }
    return schema
