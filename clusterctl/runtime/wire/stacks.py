"""Stack dumps on request: what each rank was doing when a hang was called.

The launcher arms this in every rank before the user's script runs. The
node aggregator sends DUMP_SIGNAL on the controller's hang verdict; Python's
faulthandler answers it from C, without the GIL, so a rank blocked inside a
collective still writes every thread's stack to attempt-N/stacks/rank-R.txt.
On GPUs the NCCL flight recorder is armed too (its dump is asked for through
the pipe torch creates; see rundir.NCCL_PIPE_PREFIX). Standard library only.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import IO

from clusterctl import rundir

DUMP_SIGNAL = signal.SIGURG  # ignored by default: harmless to a process that armed nothing
FLIGHT_RECORDER_ENTRIES = "2000"
_open: list[IO[str]] = []  # faulthandler writes to the file's descriptor: keep it open


def arm(attempt_dir: Path, rank: int) -> Path:
    """Dump every thread's stack to the rank's stack file on DUMP_SIGNAL; the file's path."""
    path = rundir.stack_file(attempt_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a", encoding="utf-8")
    _open.append(handle)
    faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
    return path


def arm_flight_recorder(attempt_dir: Path) -> None:
    """NCCL's flight recorder on, dumped into the attempt directory on request (unless the user chose)."""
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(attempt_dir / rundir.NCCL_TRACE_PREFIX))
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", str(attempt_dir / rundir.NCCL_PIPE_PREFIX))


def remove_empty(attempt_dir: Path) -> None:
    """Stack files of ranks never asked to dump are empty: leave only the ones that say something."""
    directory = attempt_dir / rundir.STACKS
    for path in directory.glob("rank-*.txt"):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass
    try:
        directory.rmdir()
    except OSError:
        pass
