"""How a rank's process ends once its command is done: flushed, and without tearing torch down.

A rank runs the user's script in its own interpreter (runtime/rank/launch.py),
cold or forked from its node's warm server (runtime/node/warm/child.py). Both end
here, the same way:

1. The script's namespace and every process group it destroyed are kept
   alive (`keep`, `keep_destroyed_groups`). Freeing them while the
   interpreter runs destroys DDP's Reducer and with it `ProcessGroupGloo`,
   whose destructor joins gloo's worker thread while holding the GIL; that
   thread may be waiting for the GIL to release the last work's Python
   state. Seen on every rank that still held a DDP model when its script
   returned after `destroy_process_group()`: the rank never exits, srun kills
   it 60 s later and a finished run is judged a failure and run again.
2. Non-daemon threads are joined and atexit handlers run, as the
   interpreter does first at exit; a bounded grace (`EXIT_GRACE_S`) so that a
   thread that never ends cannot keep a finished rank alive.
3. Every writable file still open is flushed (a file freed in a reference
   cycle loses its buffered tail: the script's globals are such a cycle).
4. `os._exit`: no interpreter shutdown, so nothing of torch's is destroyed
   (its threads asking for the GIL during shutdown abort the process,
   "terminate called without an active exception"), and the million
   objects torch leaves are not walked again (0.4-0.8 s a rank).

Standard library only; torch is touched only when the script imported it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import signal
import sys
import threading
from typing import Any

EXIT_GRACE_S = 10.0  # joining threads and atexit handlers may take this long after the script returned
BUFFERED_FILES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)  # what holds written bytes until a flush

_KEPT: list[Any] = []  # never freed before os._exit: the scripts' namespaces, the process groups they destroyed


def keep(obj: Any) -> Any:
    """Hold `obj` until the process ends (it is never freed while the interpreter runs)."""
    _KEPT.append(obj)
    return obj


def keep_destroyed_groups() -> None:
    """Make torch.distributed.destroy_process_group keep the groups it destroys alive until the process ends.

    Destroying a group only forgets it; the C++ group is freed when its last
    holder (a DDP Reducer) goes, which is the deadlock of the module
    docstring. Held here, the group is freed by nobody: the process ends
    with os._exit. Idempotent; a no-op when torch.distributed is not loaded.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or getattr(dist.destroy_process_group, "_clusterctl_keeps", False):
        return
    original = dist.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        with contextlib.suppress(Exception):
            c10d = sys.modules["torch.distributed.distributed_c10d"]
            world = getattr(c10d, "_world", None)
            held = list(getattr(world, "pg_map", {}) or {}) if group is None else [group]
            keep(held)
        original(group)

    destroy_process_group._clusterctl_keeps = True  # type: ignore[attr-defined]
    destroy_process_group.__doc__ = original.__doc__
    dist.destroy_process_group = destroy_process_group
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is not None and getattr(c10d, "destroy_process_group", None) is original:
        c10d.destroy_process_group = destroy_process_group


def flush_open_files() -> None:
    """Flush every writable buffered file still open, while the interpreter is whole."""
    buffered: dict[type, bool] = {}  # by type, never by isinstance: an object's own __class__ may warn or raise
    for obj in gc.get_objects():
        kind = type(obj)
        is_file = buffered.get(kind)
        if is_file is None:
            is_file = buffered[kind] = issubclass(kind, BUFFERED_FILES)
        if is_file:
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:  # noqa: BLE001, S110 - a file that cannot flush now (a closed pipe) would not at exit either
                pass


def exit_code(exc: SystemExit) -> int:
    """As the interpreter maps SystemExit: None is 0, an int itself, anything else printed and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


def end_process(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Join threads, run atexit handlers, flush, and leave with `code` without the interpreter's shutdown."""

    def give_up() -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"clusterctl: the process was still ending {grace_s:g} s after its command returned"
                             " (a thread that never ends, or a slow atexit handler): leaving now\n")
            sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(grace_s, give_up)
    timer.daemon = True
    timer.start()
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does first at exit
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def end_like(run: Any) -> None:
    """Call run() and end the process as its outcome says (its code, SystemExit, an exception printed: 1)."""
    import traceback

    code = 1
    try:
        result = run()
        code = int(result) if isinstance(result, int) else 0
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it, then exit 1
        with contextlib.suppress(Exception):
            traceback.print_exc()
        code = 1
    end_process(code)
