"""The drill's injector: clusterctl.qualify.faultsignal run on the node of the rank (or the node) to be faulted.

On the local backend it runs here (every emulated node is this machine); on
Slurm as a one-task step inside the job's allocation (srun --overlap), with
the interpreter the ranks use. One-shot faults (hang, kill, node, resume)
run to completion and report one JSON line; --slow runs in the background
until its input is closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from clusterctl import envnames
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import jobid

INJECT_TIMEOUT_S = 60.0  # one injector run, srun's start-up included


def injector_argv(backend: str, job_id: str, host: str, python: str, args: list[str]) -> list[str]:
    """How the drill runs clusterctl.qualify.faultsignal on `host`.

    local: here, with this interpreter (every emulated node is this machine).
    slurm: a one-task step on `host` inside the job's allocation, sharing its
    resources (--overlap), with the interpreter the ranks use.
    """
    inject = ["-m", "clusterctl.qualify.faultsignal", *args]
    if backend == "local":
        return [sys.executable, *inject]
    return [
        "srun", "--overlap", f"--jobid={jobid.native(job_id)}", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
        "--quiet", python, "-u", *inject,
    ]


def injector_env(backend: str) -> dict[str, str]:
    """This environment, without the variables of an allocation the drill itself may run in (SLURM_CONF kept)."""
    env = dict(os.environ)
    if backend == "slurm":
        for key in list(env):
            if key.startswith(("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")) and key != "SLURM_CONF":
                del env[key]
    return env


class InjectorFailed(ClusterctlError):
    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message, ExitCode.BACKEND_UNAVAILABLE)
        self.reason = reason


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of `text` that is a JSON object: the injector's report."""
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            if isinstance(data, dict):
                return data
    return None


def _failure(where: str, result: dict[str, Any] | None, rc: int | None, stderr: str) -> InjectorFailed:
    if result is not None and result.get("error"):
        return InjectorFailed(f"the injector on {where} refused: {result['error']}", str(result.get("reason", "")))
    tail = " | ".join(stderr.strip().splitlines()[-3:]) or "no output"
    return InjectorFailed(f"could not run the injector on {where} (exit {rc}): {tail}")


@dataclass
class Injector:
    backend: str
    job_id: str
    python: str
    token: str | None = None  # the attempt's: handed to the injector in its environment, never on its command line

    def argv(self, host: str, args: list[str]) -> list[str]:
        return injector_argv(self.backend, self.job_id, host, self.python, args)

    def env(self) -> dict[str, str]:
        env = injector_env(self.backend)
        if self.token:
            env[envnames.INJECT_TOKEN] = self.token  # srun passes it on (its default --export=ALL)
        return env

    def check(self) -> None:
        if self.backend == "slurm" and shutil.which("srun") is None:
            raise ClusterctlError("srun is not on PATH: the drill injects through srun --overlap", ExitCode.BACKEND_UNAVAILABLE)

    def once(self, host: str, args: list[str]) -> dict[str, Any]:
        """Run the injector to completion; its JSON report (ok true) or InjectorFailed."""
        try:
            proc = subprocess.run(
                self.argv(host, args), env=self.env(), stdin=subprocess.DEVNULL,
                capture_output=True, text=True, timeout=INJECT_TIMEOUT_S, check=False,
            )
        except subprocess.TimeoutExpired:
            raise InjectorFailed(f"the injector on {host} did not finish within {INJECT_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise InjectorFailed(f"could not run the injector on {host}: {exc}") from None
        result = last_json(proc.stdout)
        if proc.returncode != 0 or result is None or not result.get("ok"):
            raise _failure(host, result, proc.returncode, proc.stderr)
        return result

    def start(self, host: str, args: list[str]) -> Background:
        """Start a long-running injector (--slow); returns once it reported that it started."""
        try:
            proc = subprocess.Popen(
                self.argv(host, args), env=self.env(), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
        except OSError as exc:
            raise InjectorFailed(f"could not run the injector on {host}: {exc}") from None
        bg = Background(proc, host)
        first = bg.first_line(INJECT_TIMEOUT_S)
        if first is None or not first.get("ok"):
            bg.stop()
            raise _failure(host, first or last_json("\n".join(bg.lines)), proc.returncode, bg.stderr())
        return bg


@dataclass
class Background:
    proc: subprocess.Popen
    host: str
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._queue), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    @staticmethod
    def _pump(stream: Any, out: queue.Queue) -> None:
        for line in stream:
            out.put(line)
        out.put(None)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._err.append(line)

    def stderr(self) -> str:
        return "".join(self._err)

    def first_line(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                return None
            self.lines.append(line)
            data = last_json(line)
            if data is not None:
                return data
        return None

    def stop(self) -> dict[str, Any] | None:
        """Close the injector's input (srun passes the end on; the injector continues its process and exits).

        SIGTERM, then SIGKILL, only when it does not end: a SIGTERM to srun ends
        the step at once, so the caller continues the rank afterwards in any case.
        """
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        while True:
            try:
                line = self._queue.get(timeout=2)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
        return last_json("".join(self.lines))
