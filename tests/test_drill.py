"""`clusterctl drill` against a fabricated run whose ranks are real processes.

The run directory is written by the test (state.json with the local backend,
attempt-1/attempt.json and manifest.json naming child processes that carry
the attempt's token); the verdicts are written by a thread standing in for the
controller, after it saw the fault happen. One test runs the injector through
srun --overlap on the real Slurm test cluster, as the drill does there.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from clusterctl import envnames, rundir
from clusterctl.cli import app
from clusterctl.exitcodes import ExitCode
from clusterctl.qualify import faultdrill
from clusterctl.qualify.faultsignal import process_state
from clusterctl.qualify.injector import Injector, InjectorFailed
from clusterctl.rundir import RunDir, write_json_atomic
from tests.helpers import RUNNER
from tests.slurmlab.plugin import SlurmLab

HOSTS = ["node1", "node2"]


class FakeRun:
    """A run directory with one attempt whose two ranks (one per node) are sleeping child processes."""

    def __init__(self, path: Path, *, manifest: bool = True, job_id: str = "4242") -> None:
        self.path = path
        self.run = RunDir(path)
        self.token = secrets.token_hex(16)
        self.job_id = job_id
        self.procs: list[subprocess.Popen] = []
        self.threads: list[threading.Thread] = []
        path.mkdir(parents=True)
        (path / rundir.ATTEMPTS).touch()
        write_json_atomic(path / rundir.RUN_JSON, {"run_id": path.name, "signal": {"name": "USR2", "lead_s": 60}})
        self.run.write_state(state="submitted", backend="local", job_id=f"local-{job_id}", run_id=path.name)
        self.attempt = self.run.attempt(1)
        self.attempt.mkdir()
        for rank, host in enumerate(HOSTS):
            env = {**os.environ, envnames.TOKEN: self.token, "SLURM_JOB_ID": job_id, "SLURMD_NODENAME": host}
            env["RANK"] = str(rank)
            self.procs.append(
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, stdin=subprocess.DEVNULL)
            )
        write_json_atomic(
            self.attempt / rundir.ATTEMPT_JSON,
            {"job_id": job_id, "attempt": 1, "hosts": HOSTS, "batch_host": "node1", "master_host": "node1",
             "started": time.time()},
        )
        (self.attempt / rundir.TOKEN_FILE).write_text(self.token + "\n")
        if manifest:
            self.write_manifest()

    def write_manifest(self) -> None:
        ranks = [{"rank": r, "host": h, "pid": p.pid, "gpu": r} for r, (h, p) in enumerate(zip(HOSTS, self.procs))]
        write_json_atomic(self.attempt / rundir.MANIFEST, {"attempt": 1, "world_size": 2, "hosts": HOSTS, "ranks": ranks})

    def verdict(self, code: int, culprits: list[dict[str, Any]], *, at: float | None = None, ok: bool = False) -> None:
        write_json_atomic(
            self.attempt / rundir.VERDICT,
            {"ok": ok, "code": code, "verdict": ExitCode(code).name.lower(), "message": f"test verdict {code}",
             "culprits": culprits, "victims": [{"rank": r} for r in range(2) if r not in [c.get("rank") for c in culprits]],
             "evidence": {}, "time": time.time() if at is None else at},
        )

    def after(self, condition: Callable[[], bool], then: Callable[[], None], limit: float = 20.0) -> None:
        """In a thread: once `condition` holds (polled), run `then` (the controller giving its verdict)."""

        def watch() -> None:
            deadline = time.monotonic() + limit
            while time.monotonic() < deadline:
                if condition():
                    then()
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        self.threads.append(thread)

    def dead(self, rank: int) -> Callable[[], bool]:
        return lambda: self.procs[rank].poll() is not None

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for thread in self.threads:
            thread.join(timeout=5)


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[Callable[..., FakeRun]]:
    made: list[FakeRun] = []

    def make(name: str = "drill-run", **kw: Any) -> FakeRun:
        run = FakeRun(tmp_path / "runs" / name, **kw)
        made.append(run)
        return run

    yield make
    for run in made:
        run.close()


def drill(*args: str) -> Any:
    return RUNNER.invoke(app, ["drill", *args])


def as_json(result: Any) -> dict[str, Any]:
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_kill_detected_with_the_right_culprit(make_run: Callable[..., FakeRun]) -> None:
    run = make_run()
    run.after(run.dead(1), lambda: run.verdict(84, [{"rank": 1, "host": "node2", "gpu": 1, "reason": "died"}]))
    result = drill(str(run.path), "--kill", "1", "--timeout", "20", "--json")
    assert result.exit_code == 0, result.output
    report = as_json(result)
    assert run.procs[1].returncode == -9 and run.procs[0].poll() is None
    assert report["fault"] == "kill" and report["target"] == 1
    assert report["detected"] is True and report["culprit_right"] is True
    assert report["code"] == report["expected_code"] == 84
    assert 0 <= report["seconds"] < 10
    assert report["culprits"][0]["rank"] == 1 and len(report["victims"]) == 1


def test_a_verdict_blaming_another_rank_is_a_miss(make_run: Callable[..., FakeRun]) -> None:
    run = make_run()
    run.after(run.dead(1), lambda: run.verdict(84, [{"rank": 0, "host": "node1", "gpu": 0, "reason": "blamed"}]))
    result = drill(str(run.path), "--kill", "1", "--timeout", "20")
    assert result.exit_code == ExitCode.DRILL_MISSED, result.output
    assert "detected: yes, script_failed (84)" in result.stdout
    assert "culprit: wrong, blamed rank 0 on node1 (blamed)" in result.stdout
    assert "victims: 1" in result.stdout and "message: test verdict 84" in result.stdout
    assert "drill missed" in result.stdout


def test_no_verdict_in_time_is_a_miss_and_the_hung_rank_is_continued(make_run: Callable[..., FakeRun]) -> None:
    run = make_run()
    run.verdict(82, [{"rank": 0, "host": "node1", "reason": "old"}], at=time.time() - 60)  # before the drill: ignored
    result = drill(str(run.path), "--hang", "0", "--timeout", "3", "--json")
    assert result.exit_code == ExitCode.DRILL_MISSED, result.output
    report = as_json(result)
    assert report["detected"] is False and report["culprit_right"] is False and report["code"] is None
    assert "no verdict within 3 s" in report["note"]
    assert process_state(run.procs[0].pid) in ("S", "R")  # continued again, not left stopped
    assert run.procs[0].poll() is None and run.procs[1].poll() is None


def test_hang_detected_then_the_rank_is_continued(make_run: Callable[..., FakeRun]) -> None:
    run = make_run()
    run.after(
        lambda: process_state(run.procs[1].pid) == "T",
        lambda: run.verdict(82, [{"rank": 1, "host": "node2", "reason": "no liveness"}]),
    )
    result = drill(str(run.path), "--hang", "1", "--timeout", "20")
    assert result.exit_code == 0, result.output
    assert "fault: hang rank 1 (pid" in result.stdout and "detected: yes, hang (82)" in result.stdout
    assert "culprit: right" in result.stdout and "drill passed" in result.stdout
    assert process_state(run.procs[1].pid) in ("S", "R")


def test_slow_waits_for_registration_and_stops_the_injector(make_run: Callable[..., FakeRun]) -> None:
    run = make_run(manifest=False)
    run.after(lambda: True, lambda: (time.sleep(1.0), run.write_manifest()))
    run.after(
        lambda: (run.attempt / rundir.MANIFEST).exists() and process_state(run.procs[0].pid) == "T",
        lambda: (time.sleep(0.5), run.verdict(83, [{"rank": 0, "host": "node1", "reason": "slow"}])),
    )
    result = drill(str(run.path), "--slow", "0:4", "--timeout", "20", "--json")
    assert result.exit_code == 0, result.output
    report = as_json(result)
    assert report["fault"] == "slow" and report["detected"] and report["culprit_right"]
    assert report["seconds"] >= 0.4
    time.sleep(0.3)
    assert process_state(run.procs[0].pid) in ("S", "R")
    assert not [line for line in os.popen("ps -eo args").read().splitlines() if f"--pid {run.procs[0].pid}" in line]


def test_slow_with_a_period_stalls_the_rank_for_longer_than_a_step(make_run: Callable[..., FakeRun]) -> None:
    """--slow RANK:FACTOR:PERIOD: stalls, not a steady slowdown (2:1 stops the rank 0.5 s of every second)."""
    run = make_run()
    seen: list[str] = []

    def sample_then_judge() -> None:
        for _ in range(75):  # 1.5 s
            seen.append(process_state(run.procs[0].pid))
            time.sleep(0.02)
        run.verdict(83, [{"rank": 0, "host": "node1", "reason": "slow"}])

    run.after(lambda: process_state(run.procs[0].pid) == "T", sample_then_judge)
    result = drill(str(run.path), "--slow", "0:2:1", "--timeout", "20")
    assert result.exit_code == 0, result.output
    assert "slow rank 0 by 2x, stopped 0.5 s of every 1 s" in result.stdout
    longest = max((len(list(run_)) for state, run_ in itertools.groupby(seen) if state == "T"), default=0)
    assert 0.3 <= longest * 0.02 <= 0.8, seen  # one stall of about 0.5 s, not 0.1 s cycles
    time.sleep(0.3)
    assert process_state(run.procs[0].pid) in ("S", "R")


def test_node_loss_kills_that_nodes_processes(make_run: Callable[..., FakeRun]) -> None:
    run = make_run(job_id=f"9{secrets.randbelow(10**8)}")
    run.after(run.dead(1), lambda: run.verdict(86, [{"rank": 1, "host": "node2", "reason": "node lost"}]))
    result = drill(str(run.path), "--node", "node2", "--timeout", "20", "--json")
    assert result.exit_code == 0, result.output
    assert run.procs[1].returncode == -9 and run.procs[0].poll() is None
    report = as_json(result)
    assert report["detected"] and report["culprit_right"] and report["code"] == 86


def test_pre_timeout_waits_for_the_attempts_end(make_run: Callable[..., FakeRun], monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run()
    sent: list[tuple[str, str, str]] = []

    def send(backend: str, job_id: str, sig: str) -> None:
        sent.append((backend, job_id, sig))
        with open(run.path / rundir.ATTEMPTS, "a") as fh:
            fh.write(json.dumps({"event": "end", "attempt": 1, "job_id": job_id, "time": int(time.time()) + 1, "exit": 85}) + "\n")

    monkeypatch.setattr(faultdrill, "send_pre_timeout", send)
    result = drill(str(run.path), "--pre-timeout", "--timeout", "10", "--json")
    assert result.exit_code == 0, result.output
    assert sent == [("local", "4242", "USR2")]
    report = as_json(result)
    assert report["detected"] is True and report["culprit_right"] is None and report["code"] == 85


def test_run_id_is_looked_up_under_runs(make_run: Callable[..., FakeRun], monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run("demo-20250101-000000-abcd")
    monkeypatch.chdir(run.path.parent.parent)
    run.after(run.dead(0), lambda: run.verdict(84, [{"rank": 0, "host": "node1", "reason": "died"}]))
    result = drill(run.path.name, "--kill", "0", "--timeout", "20")
    assert result.exit_code == 0, result.output
    assert run.procs[0].returncode == -9
    result = drill("no-such-run", "--kill", "0")
    assert result.exit_code == ExitCode.USAGE
    assert "no run 'no-such-run'" in result.output and "Traceback" not in result.output


def test_a_rank_not_in_the_manifest_is_a_clear_error(make_run: Callable[..., FakeRun]) -> None:
    run = make_run()
    result = drill(str(run.path), "--kill", "7")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "rank 7 is not in attempt 1" in result.output and "valid ranks are 0-1" in result.output
    assert "Traceback" not in result.output
    assert run.procs[0].poll() is None and run.procs[1].poll() is None
    for args in (["--kill", "1", "--hang", "0"], ["--slow", "1:0.5"], ["--slow", "x"], ["--slow", "1:2:0"],
                 ["--slow", "1:2:nan"], ["--slow", "1:2:0.3:4"], []):
        result = drill(str(run.path), *args)
        assert result.exit_code == ExitCode.USAGE, (args, result.output)
        assert "Traceback" not in result.output
        if args[:1] == ["--slow"]:
            assert f"got '{args[1]}'" in result.output and "RANK:FACTOR[:PERIOD]" in result.output, result.output
    result = drill(str(run.path), "--node", "node9")
    assert result.exit_code == ExitCode.USAGE and "node1, node2" in result.output


def test_a_run_that_is_not_running_is_refused(make_run: Callable[..., FakeRun], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.LOCAL_STATE, str(tmp_path / "local-state"))
    run = make_run()
    run.run.write_state(state="dry-run")
    result = drill(str(run.path), "--kill", "0", "--timeout", "5")
    assert result.exit_code == ExitCode.BACKEND_UNAVAILABLE and "it was a dry run" in result.output
    run.run.write_state(state="submitted")
    with open(run.path / rundir.ATTEMPTS, "a") as fh:
        fh.write(json.dumps({"event": "end", "attempt": 1, "job_id": "4242", "time": int(time.time()), "exit": 0}) + "\n")
    started = time.monotonic()
    result = drill(str(run.path), "--kill", "0", "--timeout", "30")
    assert result.exit_code == ExitCode.BACKEND_UNAVAILABLE, result.output
    assert "not running: attempt 1 ended with exit 0" in result.output
    assert time.monotonic() - started < 10
    assert run.procs[0].poll() is None


def test_a_drill_waits_for_the_continuation_that_carries_the_run_on(make_run: Callable[..., FakeRun],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 1 ended and its job with it, but a continuation waits in the queue: the drill waits for its ranks (as
    the docs say) rather than calling the run stopped."""
    run = make_run()
    asked: list[str] = []
    monkeypatch.setattr(faultdrill, "_job_active", lambda _run, _backend, job: asked.append(job) or job == "4243")
    with open(run.path / rundir.ATTEMPTS, "a") as fh:
        fh.write(json.dumps({"event": "end", "attempt": 1, "job_id": "4242", "time": int(time.time()), "exit": 85}) + "\n")
        fh.write(json.dumps({"event": "next", "attempt": 1, "job_id": "4242", "time": int(time.time()), "exit": 85,
                             "how": "continuation", "next_job": "4243", "reason": "pre-timeout stop"}) + "\n")
    result = drill(str(run.path), "--kill", "0", "--timeout", "3")
    assert result.exit_code == ExitCode.BACKEND_UNAVAILABLE, result.output
    assert "no attempt with registered ranks within 3 s (attempt 1 ended (exit 85); waiting for the next attempt)" in result.output
    assert "not running" not in result.output and set(asked) == {"4243"}
    assert run.procs[0].poll() is None


def test_injector_refusal_is_reported(make_run: Callable[..., FakeRun]) -> None:
    run = make_run()
    run.procs[1].kill()
    run.procs[1].wait()
    result = drill(str(run.path), "--kill", "1", "--timeout", "5")
    assert result.exit_code == ExitCode.BACKEND_UNAVAILABLE
    assert "refused" in result.output and "has exited" in result.output and "Traceback" not in result.output


@pytest.mark.slurm
def test_injector_through_srun_overlap_reaches_the_right_rank_on_the_right_node(
    slurm_lab: SlurmLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = secrets.token_hex(16)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"export {envnames.TOKEN}={token}\n"
        f"srun {sys.executable} -c 'import os, time; "
        f'open(os.path.join("{tmp_path}", "pid-" + os.environ["SLURMD_NODENAME"]), "w").write(str(os.getpid())); '
        "time.sleep(120)'\n"
    )
    job = slurm_lab.sbatch(
        "--nodes=2", "--ntasks-per-node=1", "--time=2", f"--chdir={tmp_path}", f"--output={tmp_path / 'out'}",
        str(script),
    )
    try:
        deadline = time.monotonic() + 15
        while len(list(tmp_path.glob("pid-*"))) < 2:
            assert time.monotonic() < deadline, slurm_lab.show_job(job)
            time.sleep(0.2)
        pids = {p.name.removeprefix("pid-"): int(p.read_text()) for p in tmp_path.glob("pid-*")}
        first, second = sorted(pids)
        monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
        injector = Injector("slurm", str(job), sys.executable)
        with pytest.raises(InjectorFailed, match="does not hold this attempt's token"):
            injector.once(second, ["--pid", str(pids[second]), "--token", "wrong", "--kill"])
        result = injector.once(second, ["--pid", str(pids[second]), "--token", token, "--kill"])
        assert result["host"] == second and result["pid"] == pids[second]
        deadline = time.monotonic() + 5
        while process_state(pids[second]) not in ("", "Z"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert process_state(pids[first]) in ("S", "R")

        # --slow as the drill runs it: in the background, stopped by closing srun's input.
        slow = injector.start(first, ["--pid", str(pids[first]), "--token", token, "--slow", "20", "--stop-on-eof"])
        assert json.loads(slow.lines[0])["host"] == first
        seen = set()
        for _ in range(40):
            seen.add(process_state(pids[first]))
            time.sleep(0.02)
        assert "T" in seen
        ended = slow.stop()
        assert slow.proc.returncode == 0
        assert ended is not None and ended["ended"] == "eof" and ended["continued"] is True
        assert process_state(pids[first]) in ("S", "R")
    finally:
        slurm_lab.run(["scancel", str(job)], check=False)
