"""Exit codes, from clusterctl/exitcodes.py: the one module that defines them."""

from __future__ import annotations

from clusterctl import exitcodes
from clusterctl.exitcodes import DESCRIPTIONS, ExitCode


def markdown() -> str:
    rows = ["| code | name | meaning | what it does to the run |", "|---|---|---|---|"]
    for code in ExitCode:
        meaning, effect = DESCRIPTIONS[code]
        rows.append(f"| {int(code)} | `{code.name}` | {meaning} | {effect} |")
    head = (exitcodes.__doc__ or "").strip()
    return "# Exit codes\n\n" + head + "\n\n" + "\n".join(rows) + "\n"
