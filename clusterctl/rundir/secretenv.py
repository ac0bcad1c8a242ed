"""Secret environment variables (secret_env): taken at submit time, handed to the ranks, never written where they last.

`secret_env: [NAME, ...]` in the spec names variables (an API key, a
password) whose values the job needs but no file should keep. Their values
are read from the submitting environment when the run is submitted (and when
a stopped run is requeued by hand), and travel in one file, `.secrets.env` in
the run directory: mode 0600 in the private run directory, base64 values
(bash reads them without evaluating anything), read by the batch script at
the start of every job of the run and exported to the ranks' environment.
They never reach spec.yaml, job.sbatch, run.json (names only), the run
record, the report or the logs clusterctl writes, and never sbatch's
environment, which slurmctld keeps in its state directory: the names are
removed from the environment sbatch runs with (access.submission). The file is removed when the
run stops (the recovery step's `stop`, `clusterctl cancel`); with `--remote`
it travels inside the SSH stream with the rest of the run directory.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

FILE = ".secrets.env"  # in the run directory; the batch script reads it (templates/job.sbatch.j2)
LOOKS_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)


def missing(names: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The names that have no value to take here."""
    return [name for name in names if name not in environ]


def write(run_path: Path, names: Sequence[str], environ: Mapping[str, str]) -> None:
    """The values of `names` from `environ`, owner-only, for the batch script; nothing when no names."""
    if not names:
        return
    path = Path(run_path) / FILE
    lines = "".join(f"{name}={base64.b64encode(environ[name].encode()).decode()}\n" for name in names)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(lines)


def read(run_path: Path) -> dict[str, str]:
    """The values the run holds now ({} when it holds none)."""
    try:
        text = (Path(run_path) / FILE).read_text(encoding="ascii")
    except FileNotFoundError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {name: base64.b64decode(value).decode() for name, value in pairs}


def remove(run_path: Path) -> None:
    """The run has stopped: its secrets leave the disk."""
    try:
        os.unlink(Path(run_path) / FILE)
    except FileNotFoundError:
        pass


def suspicious(env: Mapping[str, str]) -> list[str]:
    """Names in a spec's plain `env:` that look like secrets (they would be written to spec.yaml and job.sbatch)."""
    return sorted(name for name in env if LOOKS_SECRET.search(name))
