"""clusterctl.qualify.faultsignal against real processes and real signals."""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from clusterctl import envnames
from clusterctl.qualify.faultsignal import process_state

INJECT = [sys.executable, "-m", "clusterctl.qualify.faultsignal"]

# A busy loop that publishes its count in a shared file every 2,000 iterations.
COUNTER = """
import mmap, struct, sys
with open(sys.argv[1], "r+b") as fh:
    mem = mmap.mmap(fh.fileno(), 8)
    n = 0
    while True:
        n += 1
        if n % 2000 == 0:
            mem[:8] = struct.pack("q", n)
"""


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def sleeper(procs: list[subprocess.Popen], **env: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, **env}, stdin=subprocess.DEVNULL
    )
    procs.append(proc)
    return proc


def inject(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    out = subprocess.run([*INJECT, *args], capture_output=True, text=True, timeout=60, env=env)
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr
    return out.returncode, json.loads(lines[-1])


def wait_state(pid: int, want: set[str], timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = process_state(pid)
        if state in want or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


class Counter:
    def __init__(self, path: Path, procs: list[subprocess.Popen], token: str) -> None:
        path.write_bytes(b"\0" * 8)
        self.fh = open(path, "r+b")
        self.mem = mmap.mmap(self.fh.fileno(), 8)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", COUNTER, str(path)], env={**os.environ, envnames.TOKEN: token},
            stdin=subprocess.DEVNULL,
        )
        procs.append(self.proc)
        deadline = time.monotonic() + 10
        while self.value() == 0:
            assert time.monotonic() < deadline, "the counting child never counted"
            time.sleep(0.01)

    def value(self) -> int:
        return struct.unpack("q", self.mem[:8])[0]

    def rate(self, seconds: float) -> float:
        t0, n0 = time.monotonic(), self.value()
        time.sleep(seconds)
        return (self.value() - n0) / (time.monotonic() - t0)


def test_slow_halves_progress_and_leaves_the_process_running(tmp_path: Path, procs: list) -> None:
    token = secrets.token_hex(8)
    counter = Counter(tmp_path / "count", procs, token)
    before = counter.rate(1.0)
    injector = subprocess.Popen(
        [*INJECT, "--pid", str(counter.proc.pid), "--token", token, "--slow", "2", "--for", "2"],
        stdout=subprocess.PIPE, text=True,
    )
    started = json.loads(injector.stdout.readline())
    t0, n0 = time.monotonic(), counter.value()
    rest = injector.stdout.read()
    assert injector.wait(timeout=30) == 0
    slowed = (counter.value() - n0) / (time.monotonic() - t0)
    ended = json.loads(rest.strip().splitlines()[-1])
    after = counter.rate(1.0)

    assert started["state"] == "started" and started["factor"] == 2.0
    assert ended["state"] == "ended" and ended["ended"] == "duration" and ended["continued"] is True
    assert ended["cycles"] >= 10
    unslowed = (before + after) / 2
    assert 0.3 * unslowed < slowed < 0.75 * unslowed, (before, slowed, after)
    assert process_state(counter.proc.pid) not in ("T", "t")
    assert after > 0.5 * before  # running at full speed again


def test_slow_stopped_by_sigterm_continues_the_process(tmp_path: Path, procs: list) -> None:
    token = secrets.token_hex(8)
    victim = sleeper(procs, **{envnames.TOKEN: token})
    injector = subprocess.Popen(
        [*INJECT, "--pid", str(victim.pid), "--token", token, "--slow", "20", "--period", "0.5"],
        stdout=subprocess.PIPE, text=True,
    )
    assert json.loads(injector.stdout.readline())["state"] == "started"
    assert wait_state(victim.pid, {"T"}) == "T"  # stopped for 0.475 of every 0.5 s
    injector.terminate()
    assert injector.wait(timeout=10) == 0
    ended = json.loads(injector.stdout.read().strip().splitlines()[-1])
    assert ended["ended"] == "SIGTERM" and ended["continued"] is True
    assert wait_state(victim.pid, {"S", "R"}) in ("S", "R")


def test_slow_stops_when_its_input_closes(procs: list) -> None:
    token = secrets.token_hex(8)
    victim = sleeper(procs, **{envnames.TOKEN: token})
    injector = subprocess.Popen(
        [*INJECT, "--pid", str(victim.pid), "--token", token, "--slow", "50", "--period", "1", "--stop-on-eof"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert json.loads(injector.stdout.readline())["state"] == "started"
    assert wait_state(victim.pid, {"T"}) == "T"
    injector.stdin.close()  # in the middle of a 0.98 s stop
    assert injector.wait(timeout=5) == 0
    ended = json.loads(injector.stdout.read().strip().splitlines()[-1])
    assert ended["ended"] == "eof" and ended["continued"] is True
    assert process_state(victim.pid) in ("S", "R")


def test_slow_ends_when_the_process_is_gone(procs: list) -> None:
    token = secrets.token_hex(8)
    victim = sleeper(procs, **{envnames.TOKEN: token})
    injector = subprocess.Popen(
        [*INJECT, "--pid", str(victim.pid), "--token", token, "--slow", "2"], stdout=subprocess.PIPE, text=True
    )
    injector.stdout.readline()
    victim.kill()
    assert injector.wait(timeout=10) == 0
    assert json.loads(injector.stdout.read().strip().splitlines()[-1])["ended"] == "gone"


def test_hang_stops_and_resume_continues(procs: list) -> None:
    token = secrets.token_hex(8)
    victim = sleeper(procs, **{envnames.TOKEN: token})
    rc, out = inject("--pid", str(victim.pid), "--token", token, "--hang")
    assert rc == 0 and out["action"] == "hang" and out["signal"] == "SIGSTOP" and out["pid"] == victim.pid
    assert wait_state(victim.pid, {"T"}) == "T"
    time.sleep(0.2)
    assert process_state(victim.pid) == "T"  # left stopped
    rc, out = inject("--pid", str(victim.pid), "--token", token, "--resume")
    assert rc == 0 and out["signal"] == "SIGCONT"
    assert wait_state(victim.pid, {"S", "R"}) in ("S", "R")


def test_kill_kills(procs: list) -> None:
    token = secrets.token_hex(8)
    victim = sleeper(procs, **{envnames.TOKEN: token})
    rc, out = inject("--pid", str(victim.pid), "--token", token, "--kill")
    assert rc == 0 and out["signal"] == "SIGKILL"
    assert victim.wait(timeout=5) == -9


def test_wrong_or_missing_token_is_refused_and_the_process_untouched(procs: list) -> None:
    token = secrets.token_hex(8)
    victim = sleeper(procs, **{envnames.TOKEN: token})
    plain = sleeper(procs)
    for pid, given in ((victim.pid, "not-" + token), (plain.pid, token)):
        out = subprocess.run(
            [*INJECT, "--pid", str(pid), "--token", given, "--kill"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 1
        result = json.loads(out.stdout)
        assert result["ok"] is False and result["reason"] == "token"
        assert "does not hold this attempt's token" in out.stderr and "Traceback" not in out.stderr
    time.sleep(0.2)
    assert victim.poll() is None and plain.poll() is None
    assert process_state(victim.pid) in ("S", "R")


def test_a_pid_that_is_gone_is_a_clear_error(procs: list) -> None:
    victim = sleeper(procs, **{envnames.TOKEN: "t"})
    victim.kill()
    victim.wait()
    rc, out = inject("--pid", str(victim.pid), "--token", "t", "--hang")
    assert rc == 1 and out["reason"] == "gone" and "has exited" in out["error"]


def test_node_kills_exactly_the_jobs_processes_on_that_node(procs: list) -> None:
    job = f"drill{secrets.token_hex(4)}"
    on_node = sleeper(procs, SLURM_JOB_ID=job, SLURMD_NODENAME="nodeX")
    other_node = sleeper(procs, SLURM_JOB_ID=job, SLURMD_NODENAME="nodeY")
    other_job = sleeper(procs, SLURM_JOB_ID=job + "0", SLURMD_NODENAME="nodeX")
    # The injector and its parent shell carry the same job and node, as under srun --overlap: they are spared.
    shell = subprocess.run(
        ["bash", "-c", '"$@"; echo "shell survived"', "bash", *INJECT, "--node", "nodeX", "--job", job],
        env={**os.environ, "SLURM_JOB_ID": job, "SLURMD_NODENAME": "nodeX"},
        capture_output=True, text=True, timeout=60,
    )
    assert shell.returncode == 0, shell.stderr
    lines = shell.stdout.strip().splitlines()
    assert lines[-1] == "shell survived"
    result = json.loads(lines[0])
    assert result["ok"] is True and result["killed"] == [on_node.pid]
    assert on_node.wait(timeout=5) == -9
    assert other_node.poll() is None and other_job.poll() is None


def test_command_line_mistakes_exit_2() -> None:
    for args in (["--pid", "1", "--kill"], ["--node", "n1"], ["--pid", "1", "--token", "t", "--slow", "0.5"], []):
        out = subprocess.run([*INJECT, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, args
        assert "Traceback" not in out.stderr
