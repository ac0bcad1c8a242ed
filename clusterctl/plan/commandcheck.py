"""Will the spec's `command:` start on the nodes? Refuse at submit what would fail on every rank at once.

A typo in the script's path (`[python3, trian.py]`), or a submission from
the wrong directory, otherwise fails on every rank of every attempt and
costs a restart. This looks at what the command names, in the directory the
ranks run in (`Where.workdir`), and reads nothing else of the job:

- `python ... SCRIPT` (also python3, pythonX.Y or a path to one; the
  interpreter's options before it skipped): SCRIPT must exist;
- `python ... -m MODULE`: found in the ranks' directory (first on their
  sys.path) or by the interpreter running this check, without importing it;
- `bash ... SCRIPT`, `sh ... SCRIPT`: SCRIPT must be a file;
- a path with a `/` as the program: it must be an executable file;
- a bare program name: looked up on PATH, a warning only when it is not
  there (the nodes' PATH may differ: their profile, modules, the image).

What cannot be there decides between a refusal and a warning. A missing
file is refused, except where it may exist only on the nodes: in a container
image (an absolute path, or one that climbs out of the ranks' directory; that
directory itself is bound into the image), or on a login node a remote
submission ships to. A module not found is refused only when this is the
ranks' Python with the ranks' search path: the same interpreter, no
container, no modules, no PYTHONPATH (or the like) set for the ranks, not
remote; otherwise a warning says why it may still be found there.

Pure apart from looking at the file system: no import, no process started.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import Problem

PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
PYTHON_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")
"""Variables that change where the ranks' Python finds modules: set for the ranks, `-m` is only a warning."""
_PY_WITH_ARG = "cmWX"  # -c CMD, -m MOD, -W SPEC, -X OPT; the other short options take none
_PY_LONG_WITH_ARG = frozenset({"--check-hash-based-pycs"})
_SH_WITH_ARG = "oO"  # -o OPTION, -O SHOPT (and +o, +O)
_SH_LONG_WITH_ARG = frozenset({"--rcfile", "--init-file"})


@dataclass(frozen=True)
class Where:
    """The place the ranks run, as far as the check may know it here."""

    workdir: Path  # the directory the ranks run in (relative paths of the command mean it)
    how: str = "the directory clusterctl submit ran in"  # why that directory, for the message
    spec_dir: Path | None = None  # the spec's directory: named in the hint when the file is there instead
    path: str = ""  # the PATH bare program names are looked up in (this machine's)
    image: str | None = None  # the ranks run in this container image
    modules: tuple[str, ...] = ()  # environment modules loaded before the ranks start
    remote: str | None = None  # the login node that holds the files: this machine has only the tree it ships
    python_env: tuple[str, ...] = ()  # PYTHON_ENV variables set for the ranks
    python_here: bool = True  # the ranks' Python (the site's, else clusterctl's) is the interpreter running this check
    this_python: str = ""  # that interpreter's path: a command naming another one is run by another


@dataclass(frozen=True)
class CommandCheck:
    """What the check found: problems refuse the job (exit 65), warnings are printed at submit."""

    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Target:
    kind: str  # "file" (a script), "module", or "none" (inline code, stdin)
    index: int = 0
    value: str = ""


def check_command(command: Sequence[str], where: Where) -> CommandCheck:
    """The problems and warnings of a command run by every rank in `where.workdir`."""
    if not command:
        return CommandCheck()
    found = _Found(where)
    program = command[0]
    name = os.path.basename(program)
    if "/" in program:
        found.executable(0, program)
    elif not PYTHON.match(name) and shutil.which(program, path=where.path or None) is None:
        found.not_on_path(program)
    if PYTHON.match(name):
        target = _python_target(command)
    elif name in SHELLS:
        target = _shell_target(command)
    else:
        target = _Target("none")
    if target.kind == "file":
        found.script(target.index, target.value, directory_ok=PYTHON.match(name) is not None)
    elif target.kind == "module":
        found.module(target.index, target.value, other_python=_other_python(program, where))
    return CommandCheck(tuple(found.problems), tuple(found.warnings))


def _other_python(program: str, where: Where) -> bool:
    """Whether the command names an interpreter other than the one running this check: a path to another (as
    written: a venv's python is not the base interpreter it links to, its packages differ), or another version."""
    if "/" in program:
        path = Path(program) if Path(program).is_absolute() else where.workdir / program
        return not where.this_python or os.path.abspath(path) != os.path.abspath(where.this_python)
    version = os.path.basename(program)[len("python"):]
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    return bool(version) and version not in (this, str(sys.version_info.major))


def _python_target(argv: Sequence[str]) -> _Target:
    """What `python [options] ...` runs: its script, its -m module, or nothing to look for (-c, stdin, -V)."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return _Target("file", i + 1, argv[i + 1]) if i + 1 < len(argv) else _Target("none")
        if arg.startswith("--"):
            i += 2 if arg in _PY_LONG_WITH_ARG else 1
            continue
        if arg == "-" or not arg.startswith("-"):
            return _Target("none") if arg == "-" else _Target("file", i, arg)
        group = arg[1:]
        for j, flag in enumerate(group):
            if flag in "hV?":
                return _Target("none")  # prints and exits
            if flag in _PY_WITH_ARG:
                attached = group[j + 1:]
                value, at = (attached, i) if attached else ((argv[i + 1], i + 1) if i + 1 < len(argv) else ("", i))
                if flag == "c" or not value:
                    return _Target("none")
                if flag == "m":
                    return _Target("module", at, value)
                i = at
                break
        i += 1
    return _Target("none")


def _shell_target(argv: Sequence[str]) -> _Target:
    """What `bash [options] SCRIPT` runs: SCRIPT, or nothing to look for (-c, -s, stdin)."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return _Target("file", i + 1, argv[i + 1]) if i + 1 < len(argv) else _Target("none")
        if arg.startswith("--"):
            i += 2 if arg in _SH_LONG_WITH_ARG else 1
            continue
        if arg == "-":
            return _Target("none")
        if arg[0] in "-+":
            if arg[0] == "-" and ("c" in arg or "s" in arg):
                return _Target("none")
            i += 1 + sum(flag in _SH_WITH_ARG for flag in arg[1:])
            continue
        return _Target("file", i, arg)
    return _Target("none")


class _Found:
    """Collects problems and warnings; decides which of the two a missing thing is."""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def script(self, index: int, text: str, *, directory_ok: bool) -> None:
        path = self._path(text)
        kind = _look(path)
        if kind == "file" or (directory_ok and kind == "directory"):
            return  # python runs a directory (or zip) holding __main__.py
        self._missing(index, text, path, _why(kind), "a script the ranks can run")

    def executable(self, index: int, text: str) -> None:
        path = self._path(text)
        kind = _look(path)
        if kind == "file" and os.access(path, os.X_OK):
            return
        if kind == "file":
            why = "is not executable (chmod +x it, or run it through its interpreter: [bash, FILE], [python3, FILE])"
        else:
            why = _why(kind)
        self._missing(index, text, path, why, "a program the ranks can execute")

    def not_on_path(self, program: str) -> None:
        here = self.where.workdir / program
        hint = f"; {here} exists: write ./{program} (a bare name is looked up on PATH only)" if _look(here) == "file" else ""
        self.warnings.append(
            f"command[0]: {program!r} is not on PATH here; the ranks fail at once unless the compute nodes' PATH"
            f" has it (their profile, modules, the image){hint}")

    def module(self, index: int, name: str, *, other_python: bool) -> None:
        try:
            why = missing_module(name, self.where.workdir)
        except (ImportError, OSError, ValueError) as exc:  # a finder that fails: no verdict either way
            self.warnings.append(f"command[{index}]: cannot look for module {name!r} here: {exc}")
            return
        if why is None:
            return
        unsure = self._python_unsure(other_python)
        text = f"python -m {name}: {why} (looked in {self.where.workdir}, {self.where.how}, then on this Python's path)"
        if unsure:
            self.warnings.append(f"command[{index}]: {text}; it may still be found where the ranks run: {unsure}")
            return
        self.problems.append(Problem(f"command[{index}]", name, (
            f"expected a module the ranks' Python can import: {text}; run clusterctl submit from the directory that"
            " holds the package, or install it into this Python")))

    def _python_unsure(self, other_python: bool) -> str:
        """Why the ranks' Python may find modules this one does not ('' when it is this one, as it is here)."""
        w = self.where
        reasons = []
        if w.remote:
            reasons.append(f"the ranks run on {w.remote}'s cluster")
        if w.image:
            reasons.append(f"the ranks' Python is the image's ({w.image})")
        if other_python or not w.python_here:
            reasons.append("the ranks run another interpreter than this one")
        if w.modules:
            reasons.append(f"modules {', '.join(w.modules)} are loaded first")
        if w.python_env:
            reasons.append(f"{', '.join(w.python_env)} is set for the ranks")
        return "; ".join(reasons)

    def _path(self, text: str) -> Path:
        path = Path(text)
        return path if path.is_absolute() else self.where.workdir / path

    def _missing(self, index: int, text: str, path: Path, why: str, wanted: str) -> None:
        w = self.where
        field = f"command[{index}]"
        searched = f"{path} {why} (the ranks run in {w.workdir}, {w.how})"
        if w.remote:
            self.warnings.append(f"{field}: {text!r}: {searched}; the ranks fail at once unless {w.remote} has it there")
            return
        climbs = not Path(text).is_absolute() and os.path.normpath(text).split(os.sep)[0] == ".."
        if w.image and (Path(text).is_absolute() or climbs):
            self.warnings.append(f"{field}: {text!r}: {path} {why} here; the ranks fail at once unless the image"
                                 f" {w.image} has it")
            return
        hint = _hint(text, w)
        self.problems.append(Problem(field, text, f"expected {wanted}: {searched}; {hint}"))


def _look(path: Path) -> str:
    """What is at path: 'file', 'directory', 'other', 'missing', or why it cannot be seen (a name too long)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror or exc})"
    return "file" if stat.S_ISREG(mode) else "directory" if stat.S_ISDIR(mode) else "other"


def _why(kind: str) -> str:
    """A path's _look, said after the path: `does not exist`, `is a directory`."""
    words = {"missing": "does not exist", "directory": "is a directory", "other": "is not a regular file"}
    return words.get(kind, kind)


def _hint(text: str, where: Where) -> str:
    """What to do about a path not found: the spec's directory when it is there, what expands nothing, the general rule."""
    notes = []
    if text.startswith("~") or "$" in text:
        notes.append("nothing expands ~ or $VARIABLES in command (write the path out, or use [bash, -c, \"...\"])")
    near = where.spec_dir / text if where.spec_dir is not None and not Path(text).is_absolute() else None
    if near is not None and _look(near) in ("file", "directory") and where.spec_dir != where.workdir:
        relative = os.path.relpath(near, where.workdir)
        written = f"{relative} (relative to {where.workdir})" if not relative.startswith("..") else str(near.absolute())
        notes.append(f"it is in the spec's directory: run clusterctl submit from there (cd {where.spec_dir}), or"
                     f" write it as {written}")
    else:
        notes.append(f"run clusterctl submit from the directory that holds it, or give a path relative to"
                     f" {where.workdir} or an absolute path")
    return "; ".join(notes)


def missing_module(name: str, workdir: Path) -> str | None:
    """Why `python -m name` would find no module (None when it would), looked up without importing anything:
    in `workdir` first (the ranks' sys.path starts with it), then on this interpreter's path, a package's
    submodules in its own directories, and a package needs a __main__ to run."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return f"{name!r} is not a module name"
    spec = _top_level(parts[0], workdir)
    if spec is None:
        return f"no module named {parts[0]!r}"
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations
        if locations is None:
            return f"{'.'.join(parts[:i])!r} is a module, not a package"
        found = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), list(locations))
        if found is None:
            return f"no module named {'.'.join(parts[:i + 1])!r} in {', '.join(map(str, locations))}"
        spec = found
    if spec.submodule_search_locations is not None:
        main = importlib.machinery.PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
        if main is None:
            return f"{name!r} is a package without a __main__ module: python -m runs a module"
    return None


def _top_level(name: str, workdir: Path) -> importlib.machinery.ModuleSpec | None:
    """The top-level module as the ranks' Python finds it: a regular one in workdir, else this interpreter's,
    else a namespace package (a plain directory) in workdir."""
    here = importlib.machinery.PathFinder.find_spec(name, [str(workdir)])
    if here is not None and here.origin is not None:  # a namespace package (a plain directory) has no origin
        return here
    try:
        installed = importlib.util.find_spec(name)  # a top-level name: nothing is imported to find it
    except (ImportError, ValueError):
        installed = None
    return installed if installed is not None else here
