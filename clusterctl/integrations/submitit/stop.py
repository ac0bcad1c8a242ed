"""A stop for a submitted function: rank 0's `checkpoint()`, then clusterctl's continuation.

The batch shell traps the pre-timeout signal (or a preemption's SIGTERM) and
tells the controller, which sets the stop flag in the rendezvous store
(templates/job.sbatch.j2, runtime/controller/main.py). A training loop sees the
flag at its next step (`Contract.after_step`); a plain function has no steps,
so a thread polls the flag and interrupts the main thread with SIGUSR2, the
signal submitit's own handler takes. Rank 0 then decides by submitit's rules
(its `SignalHandler`): a checkpointable callable is asked for `checkpoint()`,
whose DelayedSubmission replaces the run's submitted pickle, and every rank
exits 85, which the batch script turns into a continuation job that runs the
checkpoint. Without a checkpoint a preempted function is called again from the
start, and a timed-out one runs on until it returns or the time limit ends it
(rerunning it could only time out again). The pickle is written before any
rank exits, since srun ends the other ranks as soon as one exits 85.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from submitit.core.utils import DelayedSubmission

from clusterctl.exitcodes import ExitCode
from clusterctl.integrations.submitit.paths import save_pickle
from clusterctl.rundir import RunDir, history, runjson
from clusterctl.runtime.rank.stoprequest import STOP_SIGNALS
from clusterctl.runtime.wire import registration
from clusterctl.store import sealed

POLL_S = 0.2  # how often the stop flag is looked at: one tiny store round trip
DECISION = registration.PREFIX + "submitit/decision"  # rank 0's `go` or `stay`, for the other ranks
PEER_WAIT_S = 60.0  # how long other ranks wait for rank 0's decision (its checkpoint() may take a while)
SIGNAL_EVENT_WAIT_S = 2.0  # the batch shell records the signal before it tells the controller


@dataclass(frozen=True)
class Decision:
    go: bool  # True: every rank exits 85 and the run continues in a new job
    why: str


def checkpointable(function: Any) -> bool:
    return hasattr(function, "__submitit_checkpoint__") or hasattr(function, "checkpoint")


def decide(delayed: DelayedSubmission, submitted: Path, timed_out: bool) -> Decision:
    """Rank 0's answer to a stop, by submitit's rules; a checkpoint is written to `submitted` before it returns."""
    countdown = delayed._timeout_countdown - int(timed_out)
    if countdown < 0:
        return Decision(False, "it was stopped at the time limit more often than max_num_timeout allows: it runs on")
    if checkpointable(delayed.function):
        try:
            resumed = delayed._checkpoint_function()
        except Exception:  # noqa: BLE001 - the user's checkpoint(): its traceback goes to the log
            traceback.print_exc()
            resumed, why = None, "its checkpoint() raised (traceback above)"
        else:
            why = "its checkpoint() returned None"
        if resumed is not None:
            resumed.set_timeout(delayed._timeout_min, countdown)
            save_pickle(resumed, submitted)
            return Decision(True, "checkpoint() saved the callable; the run continues from it in a new job")
    else:
        why = "it is not checkpointable (no checkpoint method)"
    if timed_out:
        return Decision(False, f"{why}: it runs on until it returns or the time limit ends it")
    return Decision(True, f"it was preempted and {why}: the run continues in a new job that calls it from the start")


def attempt_signal(run: RunDir, attempt: int, wait_s: float = SIGNAL_EVENT_WAIT_S) -> str:
    """The stop signal the batch shell recorded for this attempt (USR2, TERM, ...); the spec's pre-timeout one if none."""
    deadline = time.monotonic() + wait_s
    while True:
        found = history.read(run).attempt(attempt)
        name = found.signal if found is not None else None
        if name or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if name:
        return name
    return (runjson.read(run.path) or runjson.RunJson()).signal.name


class StopWatch:
    """Calls `on_stop(signal name, or None for the store's flag)` once, in the main thread, on the first stop."""

    def __init__(self, on_stop: Callable[[str | None], None], store: Any) -> None:
        self._on_stop = on_stop
        self._store = store
        self._main = threading.main_thread().ident
        self._from_store = threading.Event()
        self._done = threading.Event()
        self._fired = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        self._thread: threading.Thread | None = None
        if store is not None:
            self._thread = threading.Thread(target=self._watch, name="clusterctl-submitit-stop", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(POLL_S):
            try:
                requested = sealed.read(self._store, sealed.rank_token(), registration.STOP) is not None
            except Exception:  # noqa: BLE001 - the store left with the controller: nothing more to watch
                return
            if requested:
                self._from_store.set()
                signal.pthread_kill(self._main, signal.SIGUSR2)
                return

    def _handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if self._fired or self._done.is_set():
            return
        self._fired = True
        self._on_stop(None if self._from_store.is_set() else signal.Signals(signum).name.removeprefix("SIG"))

    def close(self) -> None:
        """Stop watching; the thread is joined before the handlers go, so its signal never meets a default one."""
        if self._done.is_set():
            return
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def rank0_handler(delayed: DelayedSubmission, submitted: Path, run: RunDir, attempt: int, store: Any) -> Callable[[str | None], None]:
    """Rank 0: decide, tell the other ranks, and exit 85 when the run is to go on elsewhere."""

    def on_stop(name: str | None) -> None:
        name = name or attempt_signal(run, attempt)
        decision = decide(delayed, submitted, timed_out=name != "TERM")
        if store is not None:
            try:
                store.set(DECISION, sealed.seal(sealed.rank_token(), DECISION, "go" if decision.go else "stay"))
            except Exception:  # noqa: BLE001 - the others then decide on their own (see peer_handler)
                pass
        print(f"clusterctl: SIG{name} (stop requested): {decision.why}", file=sys.stderr, flush=True)
        if decision.go:
            raise SystemExit(int(ExitCode.PRE_TIMEOUT))

    return on_stop


def peer_handler(store: Any) -> Callable[[str | None], None]:
    """Other ranks: do what rank 0 decided (a TERM of their own ends them even without an answer)."""

    def on_stop(name: str | None) -> None:
        answer = None
        deadline = time.monotonic() + (PEER_WAIT_S if name is None else 10.0)
        while store is not None and answer is None and time.monotonic() < deadline:
            try:
                found = sealed.read(store, sealed.rank_token(), DECISION)  # rank 0's, not a stranger's
                if found is not None:
                    answer = found.decode()
            except Exception:  # noqa: BLE001 - the store is gone: rank 0 has ended
                break
            if answer is None:
                time.sleep(0.1)
        if answer == "go" or (answer is None and name == "TERM"):
            raise SystemExit(int(ExitCode.PRE_TIMEOUT))

    return on_stop
