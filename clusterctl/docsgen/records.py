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


def dataclass_rows(cls: type, prefix: str = "", fallback: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(key, type, description) of a dataclass as its JSON spells it, nested dataclasses' keys under theirs (a
    list's items under `key[]`). A key with no comment of its own takes `fallback`'s text for its path: run.json's
    keys that are the spec's fields, resolved, say what the spec's description says."""
    hints = typing.get_type_hints(cls)
    comments = line_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name, f.type)
        key = prefix + f.metadata.get("key", f.name)
        rows.append((key, _type_text(hint), comments.get(f.name) or (fallback or {}).get(key, "")))
        inner = [(a, "") for a in (hint,) if dataclasses.is_dataclass(a)]
        inner += [(a, "[]") for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        for nested, items in inner[:1]:
            rows += dataclass_rows(nested, f"{key}{items}.", fallback)
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


def keyed_records() -> list[tuple[str, Any, list[tuple[str, str, str]]]]:
    """(title, defining module or None, (key, type, meaning) rows) of each record defined by a dataclass."""
    from clusterctl.cli.status_view import RUNS_JSON_KEYS
    from clusterctl.config.spec import JobSpec
    from clusterctl.docsgen import fields
    from clusterctl.rundir import attemptjson, runjson, verdict
    from clusterctl.views import state

    spec_fields = {f.path: f.description for f in fields.fields(JobSpec)}
    added = [(key, "int" if key == "format" else "str", text) for key, text in verdict.ADDED_KEYS.items()]
    run_state = dataclass_rows(state.RunState)
    by_key = {r[0]: r for r in run_state}
    return [
        ("run.json: the static plan", runjson, dataclass_rows(runjson.RunJson, fallback=spec_fields)),
        ("attempt-N/attempt.json: one launch of all ranks", attemptjson, dataclass_rows(attemptjson.AttemptJson)),
        ("attempt-N/verdict.json: the attempt's verdict", verdict, dataclass_rows(verdict.Verdict) + added),
        ("status --json: a run's state", state, run_state),
        ("runs --json: one line per run", None,
         [(k, "int", "the number of attempts") if k == "attempts" else by_key[k] for k in RUNS_JSON_KEYS]),
    ]


def markdown(example_spec: Path) -> str:
    """The records page: the run directory, attempts.jsonl, run.json, attempt.json, verdict.json, timeline.jsonl,
    metrics.jsonl, and the JSON of status, runs and plan."""
    from clusterctl.plan.job import load_job
    from clusterctl.rundir import history, layout, metrics, timeline

    out = ["# Records and JSON outputs", "",
           "What a run directory holds and what the commands print with `--json`, each from its one definition"
           " in the code. Keys are only ever added, never renamed or removed.", "",
           "## The run directory", "", f"```text\n{_doc(layout)}\n```", "",
           "## attempts.jsonl: the run's history", "", f"```text\n{_doc(history)}\n```", ""]
    for title, module, rows in keyed_records():
        out += [f"## {title}", ""]
        if module is not None:
            out += [f"```text\n{_doc(module)}\n```", ""]
        out += [_table(rows, ("key", "type", "meaning")), ""]
    out += ["## attempt-N/timeline.jsonl: what the controller saw", "", f"```text\n{_doc(timeline)}\n```", "",
            _table([(kind, ", ".join(keys)) for kind, keys in timeline.LAYOUT.items()], ("kind", "keys, in order")), ""]
    out += ["## attempt-N/metrics.jsonl: rank 0's steps", "", f"```text\n{_doc(metrics)}\n```", ""]
    plan = json.loads(json.dumps(load_job(example_spec).plan.as_json(), default=str))
    out += ["## plan --json", "", f"The keys of `clusterctl plan --json` for `{example_spec.name}` (lists by their first item).", "",
            _table(value_rows(plan), ("key", "JSON type")), ""]
    return "\n".join(out)
