"""`clusterctl record RUN [--attempt N] [--json]`: the run record of one attempt, in four sections."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from clusterctl.cli.app import out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, RunArg, resolve_run

AttemptOpt = Annotated[Optional[int], typer.Option("--attempt", "-a", min=1, help="the attempt to show (default: the latest)")]
SECTIONS = (
    ("training", "Training definition"),
    ("data", "Data"),
    ("recovery", "Recovery"),
    ("environment", "Execution environment"),
)
SHOWN_ELSEWHERE = {"environment": ("nodes",)}


def flat(value: Any) -> str:
    """A fact on one line: `k=v, k=v` for mappings, `a, b` for lists."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        why = value.get("unknown") or {}
        return ", ".join(
            f"{k}={_nested(v)}" if v is not None else f"{k}=unknown ({why[k]})"
            for k, v in value.items()
            if k != "unknown" and (v is not None or k in why)
        ) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(flat(v) for v in value) or "-"
    return str(value)


def _nested(value: Any) -> str:
    """A value inside a mapping: nested mappings and lists bracketed, so the line still reads."""
    if isinstance(value, dict):
        return "{" + flat(value) + "}" if value else "-"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        return "[" + "; ".join(_nested(v) for v in value) + "]"
    return flat(value)


def _sources(value: Any) -> bool:
    """{spec, trainer} or {plan, trainer}: the same fact from two writers, shown one line each."""
    return isinstance(value, dict) and bool(value) and set(value) <= {"spec", "plan", "trainer"}


def _facts_table(title: str, group: dict[str, Any], said: dict[str, str], skip: tuple[str, ...] = ()) -> Table:
    """One row per fact; a reason already given (`said`: reason -> where) is referred to, not repeated."""
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column("fact", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    unknown = dict(group.get("unknown") or {})

    def unknown_text(label: str, why: str) -> Text:
        if why in said:
            return Text(f"unknown: as for {said[why]}", style="dim")
        said[why] = label
        return Text(f"unknown: {why}", style="dim")

    def row(label: str, key: str, value: Any) -> None:
        why = unknown.pop(key, None)
        table.add_row(label, unknown_text(label, why) if value is None and why else flat(value))

    for key, value in group.items():
        if key == "unknown" or key in skip:
            continue
        if _sources(value):
            for sub, inner in value.items():
                row(f"{key} ({sub})", f"{key}.{sub}", inner)
        else:
            row(key, key, value)
    for key, why in unknown.items():  # about part of a fact (source.revision)
        table.add_row(key, unknown_text(key, why))
    return table


NODE_COLUMNS = ("host", "ranks", "python", "torch", "cuda", "nccl", "driver", "switches", "env differs")
WIDE_S = 120  # columns a terminal needs for the nodes as one table; narrower, each node is a block of its own


def _nodes_table(nodes: list[dict[str, Any]], width: int) -> tuple[Table | Group, dict[str, str]]:
    """Nodes with versions, driver and switches (a table, or a block a node on a narrow terminal: 9 columns in 80
    would break every value); the environment common to all nodes returned apart."""
    envs = [n.get("env") or {} for n in nodes if n.get("env") is not None]
    common = dict(set.intersection(*(set(e.items()) for e in envs))) if envs else {}
    rows = []
    for node in nodes:
        versions = node.get("versions") or {}
        unknown = node.get("unknown") or {}
        differs = sorted(k for k, v in (node.get("env") or {}).items() if common.get(k) != v)
        extra = f" (ranks {flat(node['versions_differ_on_ranks'])} differ)" if node.get("versions_differ_on_ranks") else ""
        rows.append((
            str(node.get("host", "?")),
            str(node.get("ranks", "?")),
            str(versions.get("python") or "-"),
            str(versions.get("torch") or "-") + extra,
            str(versions.get("cuda") or "-"),
            str(versions.get("nccl") or "-"),
            str(node.get("driver") or ("unknown" if "driver" in unknown else "-")),
            " > ".join(node.get("switches") or []) or "-",
            ", ".join(differs) if node.get("env") is not None else "not recorded",
        ))
    if width < WIDE_S:
        blocks: list[Table] = []
        for row in rows:
            block = Table(title=f"Node {row[0]}", title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0))
            block.add_column("fact", style="bold", no_wrap=True)
            block.add_column("value", overflow="fold")
            for column, value in zip(NODE_COLUMNS[1:], row[1:]):
                block.add_row(column, value)
            blocks.append(block)
        return Group(*blocks), common
    table = Table(title="Nodes", title_justify="left")
    for col in NODE_COLUMNS:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table, common


def render(record: dict[str, Any]) -> None:
    """The record for people: one section per group; unknown facts with the reason."""
    console = out_console()
    run = record.get("run") or {}
    console.print(f"Run record of {run.get('id')}, attempt {record.get('attempt') if record.get('attempt') is not None else '-'}"
                  f" (attempts: {flat(run.get('attempts'))})")
    said: dict[str, str] = {}
    for key, title in SECTIONS:
        group = record.get(key) or {}
        console.print()
        if isinstance(group.get("switches"), dict):  # host -> leaf > ... > root
            group = {**group, "switches": {h: " > ".join(p) if p else None for h, p in group["switches"].items()}}
        console.print(_facts_table(title, group, said, SHOWN_ELSEWHERE.get(key, ())))
        if key == "environment" and group.get("nodes"):
            table, common = _nodes_table(group["nodes"], console.width)
            console.print(table)
            if not common:
                continue
            env = Table(title="Environment of the ranks (local rank 0 of each node; the same on every node)", title_justify="left",
                        show_header=False, box=None, padding=(0, 2, 0, 0))
            env.add_column("name", style="bold", no_wrap=True)
            env.add_column("value", overflow="fold")
            for name, value in sorted(common.items()):
                env.add_row(name, value)
            console.print(env)


def register(app: typer.Typer) -> None:
    @app.command("record")
    def record(ctx: typer.Context, run: RunArg, attempt: AttemptOpt = None, as_json: JsonOpt = False, root: RootOpt = None,
               remote: RemoteOpt = None) -> None:
        """What a reconstruction of the run needs: training definition, data, recovery, environment.

        Assembled from what each part wrote: the plan and code snapshot
        (submit), the allocation and the ranks' registrations (batch script,
        controller) and what the trainer resumed from (rank 0, through the
        contract). Unknown facts are shown with the reason.
        """
        if where := remote_target(remote):
            run_there(where, ctx)
        from clusterctl.views import record as runrecord

        found = runrecord.load(resolve_run(run, root), attempt)
        if as_json:
            print(json.dumps(found, indent=1))
            return
        render(found)
