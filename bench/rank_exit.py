"""How long a rank takes to leave once its script returned, and whether what the script wrote survives.

    .venv/bin/python bench/rank_exit.py [--quick] [--rounds N]

A rank's process has torch, torch.distributed, DCP and the reference
trainer imported (about a million objects). Each round starts two fresh
processes that run the same script through the launcher's `run_command` (a
log opened and never closed, held by the script's globals):

* `plain`: the process then ends as any Python program does (the
  interpreter's shutdown walks every object again);
* `launcher`: it ends with `procexit.end_process(0)`, as every rank does
  after its script (runtime/rank/procexit.py: files flushed, no interpreter
  shutdown).

The time is from the script's return to the process's end, as the parent
sees it. Last line: `{"plain_exit_s", "launcher_exit_s", "ratio",
"plain_lines_kept", "launcher_lines_kept", "lines_written"}` (medians over
the rounds; ratio = launcher / plain).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINES = 10
SCRIPT = f'log = open("out.txt", "w")\nlog.write("a line the script wrote\\n" * {LINES})\n\n\ndef helper():\n    pass\n'
CHILD = """
import sys, time
import torch, torch.distributed, torch.distributed.checkpoint, torch.nn.parallel
import clusterctl.trainer
from clusterctl.runtime.rank.launch import run_command
from clusterctl.runtime.rank.procexit import end_process
mode = sys.argv[1]  # run_command gives sys.argv to the script
run_command(["python3", "script.py"])
sys.stdout.write(repr(time.time()) + "\\n")  # the script returned: the clock starts
sys.stdout.flush()
if mode == "launcher":
    end_process(0)
"""


def one(mode: str, work: Path) -> tuple[float, int]:
    """Seconds from the script's return to the process's end, and the lines its log kept."""
    (work / "script.py").write_text(SCRIPT)
    (work / "out.txt").unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], cwd=work, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    returned = float(proc.stdout.readline())
    proc.wait(timeout=120)
    ended = time.time()
    kept = (work / "out.txt").read_text().count("\n") if (work / "out.txt").exists() else 0
    return ended - returned, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds (under a minute)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    found: dict[str, list[tuple[float, int]]] = {"plain": [], "launcher": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for mode in (("plain", "launcher") if r % 2 == 0 else ("launcher", "plain")):  # alternate: drift cancels
                found[mode].append(one(mode, Path(tmp)))
    exit_s = {mode: statistics.median(s for s, _ in runs) for mode, runs in found.items()}
    kept = {mode: min(k for _, k in runs) for mode, runs in found.items()}
    for mode in found:
        print(f"{mode:9s} exit {exit_s[mode]:.3f} s (median of {rounds}), log kept {kept[mode]} of {LINES} lines")
    print(json.dumps({"plain_exit_s": round(exit_s["plain"], 3), "launcher_exit_s": round(exit_s["launcher"], 3),
                      "ratio": round(exit_s["launcher"] / exit_s["plain"], 3), "plain_lines_kept": kept["plain"],
                      "launcher_lines_kept": kept["launcher"], "lines_written": LINES}))


if __name__ == "__main__":
    main()
