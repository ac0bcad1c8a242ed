"""The command line, from the typer application itself: every command's usage, help, arguments and options."""

from __future__ import annotations

from typing import Any

import typer.main


def _commands(group: Any, parent: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """(full name, command, context) of every visible command, groups' subcommands after their group."""
    found = []
    for name in group.list_commands(parent):
        command = group.get_command(parent, name)
        if command is None or command.hidden:
            continue
        ctx = command.context_class(command, info_name=name, parent=parent)
        found.append((f"{prefix} {name}", command, ctx))
        if hasattr(command, "list_commands"):
            found += _commands(command, ctx, f"{prefix} {name}")
    return found


def commands(app: Any) -> list[tuple[str, Any, Any]]:
    root = typer.main.get_command(app)
    return _commands(root, root.context_class(root, info_name="clusterctl"), "clusterctl")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def parameters(command: Any) -> list[dict[str, str]]:
    """Each visible argument and option: its names, placeholder, default and help."""
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        kind = getattr(param, "param_type_name", "")
        names = ", ".join(f"`{o}`" for o in [*param.opts, *getattr(param, "secondary_opts", [])])
        if kind == "argument":
            names = f"`{param.metavar or param.name.upper()}`"
        default = param.default
        shown = "" if default in (None, False, (), []) or callable(default) else f"`{default}`"
        takes = "" if getattr(param, "is_flag", False) or kind == "argument" else str(param.metavar or "")
        rows.append({"kind": kind, "names": names, "value": takes,
                     "default": shown, "help": _cell(getattr(param, "help", None) or "")})
    return rows


def markdown(app: Any) -> str:
    """The CLI reference page."""
    out = ["# Command line", "", "Generated from the command-line application: what `--help` says, every command on one page.", ""]
    for name, command, ctx in commands(app):
        out += [f"## `{name}`", "", f"```\n{command.get_usage(ctx)}\n```", "", (command.help or "").strip(), ""]
        rows = parameters(command)
        if rows:
            out += ["| argument or option | value | default | meaning |", "|---|---|---|---|"]
            out += [f"| {r['names']} | {_cell(r['value'])} | {r['default']} | {r['help']} |" for r in rows]
            out.append("")
    return "\n".join(out)
