"""A small job for the detection tests: real aggregators, real stand-in ranks, real srun (the local shim).

Everything on the heartbeat path is the product's own code — the node
aggregators (`python -m clusterctl.runtime.node.aggregator`, one srun step with
--overlap, as the batch script starts them), the ranks' heartbeat client,
the controller's WatchServer with its watchdog, its verdict response (stack
dumps, stopping the ranks) and its end-of-attempt judgement. What stands in:
the ranks are tests/programs/standin_rank.py (no torch: ~2 s of CPU saved per
rank), their collective is a barrier served here, and the controller's store
is not needed (no rendezvous). Faults come from outside through
`python -m clusterctl.qualify.faultsignal`, as `clusterctl drill` injects them.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from clusterctl import envnames, rundir
from clusterctl.backends.local import BIN_DIR
from clusterctl.rundir.runjson import WatchdogRecord as Settings
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.controller.response import Response
from clusterctl.runtime.controller.keeper import VerdictKeeper
from clusterctl.runtime.controller.watchdog import Watchdog
from clusterctl.runtime.controller.watchserver import WatchServer
from clusterctl.trainer.busy import calibrate

STANDIN = Path(__file__).resolve().parent / "programs" / "standin_rank.py"
REPO = Path(__file__).resolve().parents[1]
_RATE: list[float] = []


def units_for(seconds: float) -> int:
    """Busy-compute units that take about `seconds` of one CPU here (calibrated once per session)."""
    if not _RATE:
        _RATE.append(calibrate(0.3))
    return max(1, round(seconds * _RATE[0]))


class BarrierServer:
    """The stand-ins' collective: everyone's line in, then `go` to all; a lost peer closes every connection."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.conns: dict[int, socket.socket] = {}
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        readers = {}
        while len(self.conns) < self.world:
            conn, _ = self.listener.accept()
            reader = conn.makefile("rb")
            rank = int(reader.readline())
            self.conns[rank], readers[rank] = conn, reader
        while True:
            for rank in range(self.world):
                try:
                    line = readers[rank].readline()
                except OSError:  # a killed rank's connection resets: the same as closing it
                    line = b""
                if not line:
                    for conn in self.conns.values():  # a peer is gone: every other rank sees it
                        conn.close()
                    return
            for conn in self.conns.values():
                try:
                    conn.sendall(b"go\n")
                except OSError:
                    return

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns.values():
            conn.close()


class MiniJob:
    def __init__(
        self,
        tmp: Path,
        *,
        steps: int,
        compute_s: float,
        settings: Settings,
        nodes: int = 2,
        per_node: int = 2,
        extra: list[str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.world = nodes * per_node
        self.hosts = [f"node{i + 1}" for i in range(nodes)]
        self.per_node = per_node
        self.token = secrets.token_hex(16)
        self.job_id = str(900000 + secrets.randbelow(99999))
        self.attempt_dir = tmp / "attempt-1"
        (self.attempt_dir / rundir.LOGS).mkdir(parents=True)
        self.watchdog = Watchdog(self.world, self.hosts, per_node, settings)
        self.findings: list[tuple[float, Verdict]] = []
        listener = socket.create_server(("127.0.0.1", 0))
        self.server = WatchServer(
            listener, self.token, self.watchdog, self.attempt_dir / rundir.TIMELINE, self._on_finding, lambda m: None
        )
        self.response = Response(self.attempt_dir, self.server, self.watchdog, VerdictKeeper(self.attempt_dir, lambda m: None))
        self.barrier = BarrierServer(self.world)
        self.args = ["--steps", str(steps), "--units", str(units_for(compute_s)), *(extra or [])]
        self.procs: list[subprocess.Popen[bytes]] = []

    def _on_finding(self, finding: Verdict) -> None:
        called = time.time()
        self.response.on_finding(finding)  # verdict.json, stacks, ranks stopped
        self.findings.append((called, finding))

    def env(self) -> dict[str, str]:
        nodelist = f"node[1-{len(self.hosts)}]"
        env = dict(
            os.environ,
            SLURM_JOB_ID=self.job_id,
            SLURM_JOB_NAME="detect",
            SLURM_JOB_NODELIST=nodelist,
            SLURM_JOB_NUM_NODES=str(len(self.hosts)),
            SLURM_NTASKS_PER_NODE=str(self.per_node),
            SLURM_NTASKS=str(self.world),
            SLURM_JOB_CPUS_PER_NODE=f"{self.per_node}(x{len(self.hosts)})",
            CLUSTERCTL_LOCAL_STATE=str(self.tmp / "nostate"),
            CLUSTERCTL_LOCAL_PYTHON=sys.executable,
            PATH=f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}",
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        )
        env[envnames.TOKEN] = self.token
        env[envnames.OVERSUBSCRIBED] = "1"  # as the batch script says for the local site
        env[envnames.ATTEMPT_DIR] = str(self.attempt_dir)
        env[envnames.WATCH_ADDR] = f"127.0.0.1:{self.server.port}"
        env[envnames.HEARTBEAT_DIR] = str(self.tmp)
        env.pop(envnames.HEARTBEAT_SOCKET, None)
        return env

    def start(self) -> MiniJob:
        self.server.start()
        env = self.env()
        logs = self.attempt_dir / rundir.LOGS
        aggregators = [
            "srun", "--overlap", "--kill-on-bad-exit=0", f"--nodes={len(self.hosts)}", f"--ntasks={len(self.hosts)}",
            "--ntasks-per-node=1", f"--output={logs}/aggregator-%n.log", f"--error={logs}/aggregator-%n.log",
            sys.executable, "-m", "clusterctl.runtime.node.aggregator",
        ]
        self.procs.append(subprocess.Popen(aggregators, env=env, cwd=self.tmp))
        ranks = [
            "srun", "--label", "--kill-on-bad-exit=1", f"--nodes={len(self.hosts)}", f"--ntasks={self.world}",
            f"--ntasks-per-node={self.per_node}", f"--output={logs}/node-%n.log", f"--error={logs}/node-%n.log",
            sys.executable, str(STANDIN), "--barrier", self.barrier.address, *self.args,
        ]
        with open(self.attempt_dir / rundir.SRUN_LOG, "ab") as srun_log:
            self.ranks = subprocess.Popen(ranks, env=env, cwd=self.tmp, stderr=srun_log)
        self.procs.append(self.ranks)
        self.server.arm()
        return self

    # --- watching ------------------------------------------------------------------
    def wait_steps(self, steps: int, timeout: float = 120) -> None:
        """Until every rank reported `steps` finished steps (and its pid)."""
        ok = self.server.wait_until(
            lambda: all(r.steps_done >= steps and r.pid for r in self.watchdog.ranks), timeout
        )
        assert ok, f"ranks did not reach step {steps}: {[(r.rank, r.steps_done) for r in self.watchdog.ranks]}"

    def pid(self, rank: int) -> int:
        pid = self.watchdog.ranks[rank].pid
        assert pid, f"rank {rank} sent no heartbeat"
        return pid

    def inject(self, *args: str) -> dict[str, Any]:
        """`python -m clusterctl.qualify.faultsignal ARGS` from outside; its JSON report."""
        out = subprocess.run(
            [sys.executable, "-m", "clusterctl.qualify.faultsignal", *args], capture_output=True, text=True, timeout=60,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    def slow(self, rank: int, factor: float, seconds: float) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "clusterctl.qualify.faultsignal", "--pid", str(self.pid(rank)), "--token", self.token,
             "--slow", str(factor), "--for", str(seconds)],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
        )

    def wait_finding(self, timeout: float) -> tuple[float, Verdict] | None:
        self.server.wait_until(lambda: bool(self.findings), timeout)
        return self.findings[0] if self.findings else None

    def end(self, timeout: float = 60) -> Verdict | None:
        """Wait for the ranks' srun to end, then judge the attempt as the controller does."""
        self.ranks.wait(timeout=timeout)
        errors_dir = self.attempt_dir / "errors"
        errors = {int(p.stem.split("-")[1]): p.read_text() for p in errors_dir.glob("rank-*.txt")} if errors_dir.is_dir() else {}
        gpus = {r.rank: r.gpu for r in self.watchdog.ranks}
        return self.response.end_verdict(errors, gpus)

    def verdict(self) -> dict[str, Any]:
        return json.loads((self.attempt_dir / rundir.VERDICT).read_text())

    def timeline(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.attempt_dir / rundir.TIMELINE).read_text().splitlines()]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self.server.close()
        self.barrier.close()
