"""The run directory's records and the commands' JSON, from their one definition each.

A dataclass record is listed key by key with its type and the comment its
definition carries on the key's line (read from the source: the comment is
where a reader of the code looks too). `plan --json` has no dataclass: its
keys come from the plan of a shipped example, computed when the page is built.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tokenize
import typing
from pathlib import Path
from typing import Any


def line_comments(cls: type) -> dict[str, str]:
    """The trailing comment on each `name: type` line of a class body."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    name_of_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.start[0] not in name_of_line:
            name_of_line[tok.start[0]] = tok.string
        if tok.type == tokenize.COMMENT and tok.start[0] in name_of_line:
            found.setdefault(name_of_line[tok.start[0]], tok.string.lstrip("# ").strip())
    return found


def _type_text(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    return text if not isinstance(hint, type) else hint.__name__


def dataclass_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, type, description) of a dataclass, nested dataclasses' keys under theirs."""
    hints = typing.get_type_hints(cls)
    comments = line_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name, f.type)
        rows.append((prefix + f.name, _type_text(hint), comments.get(f.name, "")))
        inner = [a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)]
        for nested in inner[:1]:
            rows += dataclass_rows(nested, f"{prefix}{f.name}.")
    return rows


def value_rows(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(key, JSON type) of every key of a JSON value, lists by their first item."""
    if isinstance(value, dict):
        rows = []
        for key, item in value.items():
            rows.append((prefix + str(key), type(item).__name__.replace("NoneType", "null")))
            rows += value_rows(item, f"{prefix}{key}.")
        return rows
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return value_rows(value[0], prefix.rstrip(".") + "[].")
    return []


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(rows: list[tuple[str, ...]], headers: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| `" + r[0] + "` | " + " | ".join(_cell(c) for c in r[1:]) + " |" for r in rows]
    return "\n".join(lines)


def _doc(module: Any) -> str:
    return inspect.cleandoc(module.__doc__ or "")


def markdown(example_spec: Path) -> str:
    """The records page: run.json, attempt.json, verdict.json, timeline.jsonl, metrics.jsonl, status and plan JSON."""
    from clusterctl.plan.job import load_job
    from clusterctl.rundir import attemptjson, metrics, runjson, timeline, verdict
    from clusterctl.views import state

    out = ["# Records and JSON outputs", "",
           "What a run directory holds and what the commands print with `--json`, each from its one definition"
           " in the code. Keys are only ever added, never renamed or removed.", ""]
    sections = [
        ("run.json: the static plan", runjson, runjson.RunJson),
        ("attempt-N/attempt.json: one launch of all ranks", attemptjson, attemptjson.AttemptJson),
        ("attempt-N/verdict.json: the attempt's verdict", verdict, verdict.Verdict),
        ("status --json: a run's state", state, state.RunState),
        ("status --json: one attempt (`attempts[]`)", None, state.Attempt),
    ]
    for title, module, cls in sections:
        out += [f"## {title}", ""]
        if module is not None:
            out += [f"```text\n{_doc(module)}\n```", ""]
        out += [_table(dataclass_rows(cls), ("key", "type", "meaning")), ""]
    out += ["## attempt-N/timeline.jsonl: what the controller saw", "", f"```text\n{_doc(timeline)}\n```", "",
            _table([(kind, ", ".join(keys)) for kind, keys in timeline.LAYOUT.items()], ("kind", "keys, in order")), ""]
    out += ["## attempt-N/metrics.jsonl: rank 0's steps", "", f"```text\n{_doc(metrics)}\n```", ""]
    plan = json.loads(json.dumps(load_job(example_spec).plan.as_json(), default=str))
    out += ["## plan --json", "", f"The keys of `clusterctl plan --json` for `{example_spec.name}` (lists by their first item).", "",
            _table(value_rows(plan), ("key", "JSON type")), ""]
    return "\n".join(out)
