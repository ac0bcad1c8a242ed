"""The launcher runs a Python command in the rank's own process: a script, `-m module` and `-c code` alike.

So every form gets the interpreter clusterctl runs with (the one whose
torch the job registered) and the step watcher, never whatever `python3` is
first on the node's PATH.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def launched(*command: str, cwd: Path) -> str:
    code = f"from clusterctl.runtime.rank.launch import run_command; run_command({list(command)!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={"PATH": "/nonexistent"})  # no python3 to exec: only the in-process way works
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_script_module_and_code_run_in_the_launchers_interpreter(tmp_path: Path) -> None:
    shown = "import sys; print(sys.executable, sys.argv[1:], __name__)"
    (tmp_path / "script.py").write_text(shown + "\n")
    assert launched("python3", "script.py", "x", cwd=tmp_path) == f"{sys.executable} ['x'] __main__\n"
    assert launched("python3", "-c", shown, "y", cwd=tmp_path) == f"{sys.executable} ['y'] __main__\n"
    (tmp_path / "mod.py").write_text(shown + "\n")
    assert launched("python", "-m", "mod", "z", cwd=tmp_path) == f"{sys.executable} ['z'] __main__\n"


def test_a_file_the_script_never_closed_keeps_every_line(tmp_path: Path) -> None:
    """Run as the launcher runs a rank's script and left as it leaves: nothing the script wrote is lost. Under runpy
    alone the script's globals end in a reference cycle and the buffered tail of its file was: 0 of 10 lines."""
    (tmp_path / "script.py").write_text('log = open("out.txt", "w")\nlog.write("line\\n" * 10)\n\n\ndef helper():\n    pass\n')
    code = ("from clusterctl.runtime.rank.launch import run_command; from clusterctl.runtime.rank.procexit import end_process;"
            " run_command(['python3', 'script.py']); end_process(0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/nonexistent"})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "out.txt").read_text() == "line\n" * 10
