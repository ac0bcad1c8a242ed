"""The rank's process: `python -m clusterctl.launch -- <command>`.

The wrapper execs this once per rank, so the rank's Python process is the
only one per GPU: a Python command (`python -m mod ...`, `python script.py
...`) runs in-process, anything else replaces this process. Standard library
only until the user's code imports what it needs.
"""

from __future__ import annotations

import os
import runpy
import sys

PYTHONS = ("python", "python3", os.path.basename(sys.executable))


def run_command(argv: list[str]) -> None:
    """Run argv in this process when it is Python, else exec it."""
    if not argv:
        raise SystemExit("clusterctl.launch: no command given (usage: python -m clusterctl.launch -- CMD ...)")
    if os.path.basename(argv[0]) in PYTHONS and len(argv) > 1:
        args = argv[1:]
        if args[0] == "-m" and len(args) > 1:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            return
        if not args[0].startswith("-"):
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            runpy.run_path(args[0], run_name="__main__")
            return
    os.execvp(argv[0], argv)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    run_command(args)


if __name__ == "__main__":
    main()
