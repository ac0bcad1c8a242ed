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
    tail = ("A bad spec or site exits 65 with one message listing every problem (field path, line in the file or"
            " \"from --set\", the value given and what is allowed) and writes nothing.")
    return "# Exit codes\n\n" + head + "\n\n" + "\n".join(rows) + "\n\n" + tail + "\n"
