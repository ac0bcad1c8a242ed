"""The scheduler query's contract, one suite run through both implementations against the real Slurm
test cluster: the CLI one (squeue/scontrol/scancel) and the pyslurm one. Each answer is also checked
against the CLI's at the same moment, so the two must agree (normalised as query.py documents).

pyslurm is an optional extra: its runs skip with the reason where it cannot be used, and fail when
CI is set (.ci/run installs it). Jobs are short sleeps; every one is cancelled at the end and every
node drained here is resumed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import dead_slurm_conf

from clusterctl.backends.base import JobInfo
from clusterctl.backends.slurm import pyslurmprobe
from clusterctl.backends.slurm.backend import SlurmBackend
from clusterctl.backends.slurm.choose import QUERY_ENV, choose_query
from clusterctl.backends.slurm.cliquery import CliQuery, parse_squeue_line
from clusterctl.backends.slurm.query import SchedulerQuery, node_reason, node_state, task_ranges, wait_status
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

T = TypeVar("T")
DRAINED = "n4"  # the node the drain test takes out; jobs here avoid it
BUSY = "n3"  # where the MIXED job runs
NEVER_SEEN = "987654"  # far above any id the test cluster hands out in a test run


def pyslurm_or_skip() -> None:
    problem = pyslurmprobe.problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"pyslurm unusable with CI set: {problem}", pytrace=False)
    pytest.skip(f"pyslurm unusable: {problem}")


@pytest.fixture(params=["cli", pytest.param("pyslurm")])
def query(request: pytest.FixtureRequest, slurm_lab: Any, monkeypatch: pytest.MonkeyPatch) -> SchedulerQuery:
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    if request.param == "cli":
        return CliQuery()
    pyslurm_or_skip()
    from clusterctl.backends.slurm.pyslurmquery import PyslurmQuery

    return PyslurmQuery()


@pytest.fixture
def jobs(slurm_lab: Any, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """sbatch for the test (short jobs, one CPU, output under tmp_path); all cancelled at its end."""
    submitted: list[str] = []

    def submit(*args: str, wrap: str = "sleep 20") -> str:
        job_id = str(slurm_lab.sbatch(f"--output={tmp_path}/slurm-%j.out", "--ntasks=1", f"--exclude={DRAINED}", *args, "--wrap", wrap))
        submitted.append(job_id)
        return job_id

    yield submit
    if submitted:
        slurm_lab.run(["scancel", *submitted], check=False)


def same(query: SchedulerQuery, ask: Callable[[SchedulerQuery], T]) -> T:
    """The answer of `query`, checked against the CLI's at the same moment (retried while a job moves on)."""
    for _ in range(5):
        answer, reference = ask(query), ask(CliQuery())
        if answer == reference:
            return answer
        time.sleep(0.3)
    assert answer == reference, f"{query.name} and cli disagree"
    return answer


def wait_for(query: SchedulerQuery, job_id: str, done: Callable[[JobInfo], bool], timeout: float = 30) -> JobInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = query.job(job_id)
        if info is not None and done(info):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} never got there: {info}")
        time.sleep(0.25)


# --- against the test cluster ------------------------------------------------------------------


@pytest.mark.slurm
def test_a_job_through_its_life(query: SchedulerQuery, jobs: Callable[..., str], slurm_lab: Any) -> None:
    held = jobs("--hold", wrap="sleep 2")
    failing = jobs(wrap="sleep 1; exit 3")
    doomed = jobs(wrap="sleep 30")

    info = same(query, lambda q: q.job(held))
    assert (info.state, info.reason, info.nodes, info.exit_code, info.requeue_count) == ("PENDING", "JobHeldUser", "", 0, 0)
    slurm_lab.run(["scontrol", "release", held])
    running = wait_for(query, held, lambda i: i.state == "RUNNING")
    assert running.nodes and running.batch_host == running.nodes and running.reason == ""
    done = wait_for(query, held, lambda i: i.finished)
    assert (done.state, done.exit_code, done.exit_signal) == ("COMPLETED", 0, None)
    assert same(query, lambda q: q.job(held)) == done

    failed = wait_for(query, failing, lambda i: i.finished)
    assert (failed.state, failed.exit_code, failed.exit_signal) == ("FAILED", 3, None)
    assert same(query, lambda q: q.job(failing)) == failed

    wait_for(query, doomed, lambda i: i.state == "RUNNING")
    query.cancel(doomed)
    cancelled = wait_for(query, doomed, lambda i: i.finished)
    # The batch shell either dies of the signal itself or, when `sleep` got it first, exits 128 + signal; pyslurm
    # 22.5 reads such a status as status - 128 (query.py's docstring), the CLI as it is.
    assert cancelled.state == "CANCELLED", cancelled
    killed = (cancelled.exit_code, cancelled.exit_signal)
    assert killed in {(0, 9), (0, 15), (137, None), (143, None), (9, None), (15, None)}, cancelled
    assert same(query, lambda q: q.job(doomed)) == cancelled
    query.cancel(doomed)  # ended already: not an error
    query.cancel(NEVER_SEEN)  # forgotten: not an error either


@pytest.mark.slurm
def test_exit_status_from_128_up_is_the_one_known_difference(slurm_lab: Any, jobs: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """pyslurm 22.5 takes 128+n for a shell's signal n and reports n (query.py documents it)."""
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    pyslurm_or_skip()
    from clusterctl.backends.slurm.pyslurmquery import PyslurmQuery

    job = jobs(wrap="exit 130")
    cli = wait_for(CliQuery(), job, lambda i: i.finished)
    assert (cli.state, cli.exit_code) == ("FAILED", 130)
    assert PyslurmQuery().job(job) == JobInfo(**{**cli.__dict__, "exit_code": 2})


@pytest.mark.slurm
def test_a_job_slurmctld_does_not_know_is_none(query: SchedulerQuery, slurm_lab: Any) -> None:
    assert query.job(NEVER_SEEN) is None
    assert query.jobs([NEVER_SEEN]) == {NEVER_SEEN: None}
    for act in (query.requeue, lambda j: query.signal(j, "USR2")):
        with pytest.raises(ClusterctlError) as err:
            act(NEVER_SEEN)
        assert err.value.exit_code == ExitCode.BACKEND_UNAVAILABLE and "Invalid job id" in err.value.message


@pytest.mark.slurm
def test_many_jobs_at_once_with_array_tasks(query: SchedulerQuery, jobs: Callable[..., str]) -> None:
    array = jobs("--hold", "--array=0-49", wrap="true")
    plain = [jobs("--hold", wrap="true") for _ in range(3)]
    asked = [*plain, *(f"{array}_{k}" for k in range(50)), f"{array}_50", NEVER_SEEN]
    answers = same(query, lambda q: q.jobs(asked))
    assert list(answers) == asked
    assert answers[f"{array}_50"] is None and answers[NEVER_SEEN] is None  # no such task; no such job
    known = [answers[j] for j in asked[:-2]]
    assert all(i is not None and (i.state, i.reason) == ("PENDING", "JobHeldUser") for i in known)
    assert [i.job_id for i in known if i] == asked[:-2]  # answered under the id asked for


@pytest.mark.slurm
def test_nodes_drained_busy_and_a_job_pending_on_them(query: SchedulerQuery, jobs: Callable[..., str], slurm_lab: Any) -> None:
    busy = jobs(f"--nodelist={BUSY}", wrap="sleep 20")  # one CPU of eight: scontrol says MIXED
    reason = f"clusterctl query test {os.getpid()}"
    slurm_lab.run(["scontrol", "update", f"nodename={DRAINED}", "state=drain", f"reason={reason}"])
    try:
        stuck = str(slurm_lab.sbatch(f"--nodelist={DRAINED}", "--output=/dev/null", "--wrap", "true"))
        try:
            wait_for(query, busy, lambda i: i.state == "RUNNING")
            nodes = same(query, lambda q: q.nodes())
            assert [n.name for n in nodes] == ["n1", "n2", "n3", "n4"]
            assert all(n.partitions == ("gpu",) and n.features == () for n in nodes)
            by_name = {n.name: n for n in nodes}
            assert by_name[DRAINED].drained and by_name[DRAINED].reason == reason
            assert by_name[BUSY].state == "ALLOCATED" and not by_name[BUSY].drained
            pending = wait_for(query, stuck, lambda i: i.reason != "", timeout=15)
            assert pending.state == "PENDING" and "ReqNodeNotAvail" in pending.reason
            assert same(query, lambda q: q.job(stuck)) == pending
        finally:
            slurm_lab.run(["scancel", stuck], check=False)
    finally:
        slurm_lab.run(["scontrol", "update", f"nodename={DRAINED}", "state=resume"], check=False)
    assert not {n.name: n for n in query.nodes()}[DRAINED].drained


@pytest.mark.slurm
def test_requeue_raises_the_requeue_count(query: SchedulerQuery, jobs: Callable[..., str]) -> None:
    job = jobs("--requeue", wrap="sleep 30")
    before = wait_for(query, job, lambda i: i.state == "RUNNING")
    assert before.requeue_count == 0
    query.requeue(job)
    after = wait_for(query, job, lambda i: i.requeue_count == 1)
    assert after.state in ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING", "COMPLETING")
    assert same(query, lambda q: q.job(job).requeue_count) == 1  # type: ignore[union-attr]


@pytest.mark.slurm
def test_signal_reaches_the_batch_shell(query: SchedulerQuery, jobs: Callable[..., str], tmp_path: Path) -> None:
    got, ready = tmp_path / "got", tmp_path / "ready"
    script = f"trap 'echo USR2 > {got}; exit 0' USR2; touch {ready}; sleep 30 & wait"
    job = jobs(wrap=script)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, query.job(job)
        time.sleep(0.2)
    query.signal(job, "USR2")
    done = wait_for(query, job, lambda i: i.finished)
    assert got.read_text().strip() == "USR2" and (done.state, done.exit_code) == ("COMPLETED", 0)


@pytest.mark.slurm
@pytest.mark.parametrize("way", ["cli", "pyslurm"])
def test_an_unreachable_controller_is_exit_69(way: str, slurm_lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a child process: libslurm reads its slurm.conf once per process, and this one names a dead port."""
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    if way == "pyslurm":
        pyslurm_or_skip()
    dead = dead_slurm_conf(slurm_lab.conf, tmp_path / "slurm.conf")
    code = ("from clusterctl.backends.slurm.choose import choose_query\n"
            "from clusterctl.errors import ClusterctlError\n"
            "q = choose_query()\n"
            "try:\n    q.jobs(['1', '2'])\nexcept ClusterctlError as exc:\n    print(q.name, int(exc.exit_code), exc.message)\n")
    env = {**os.environ, "SLURM_CONF": str(dead), QUERY_ENV: way}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    name, code_, message = (out.stdout.strip().split(" ", 2) + ["", "", ""])[:3]
    assert (out.returncode, name, code_) == (0, way, "69"), out.stdout + out.stderr
    assert "contact slurm controller" in message.lower()


@pytest.mark.slurm
def test_the_slurm_backend_goes_through_the_chosen_query(slurm_lab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm_lab.conf)
    monkeypatch.delenv(QUERY_ENV, raising=False)
    expected = "pyslurm" if pyslurmprobe.problem() is None else "cli"
    backend = SlurmBackend()
    assert backend.info(NEVER_SEEN) is None and backend.query.name == expected
    monkeypatch.setenv(QUERY_ENV, "cli")
    assert SlurmBackend().query.name == "cli"


# --- without the cluster -------------------------------------------------------------------------
def test_choice_is_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    monkeypatch.setenv(QUERY_ENV, "cli")
    assert choose_query().name == "cli"
    monkeypatch.setenv(QUERY_ENV, "auto")
    assert choose_query().name == "cli"  # no slurm.conf: pyslurm is never imported
    monkeypatch.setenv(QUERY_ENV, "pyslurm")
    with pytest.raises(ClusterctlError) as err:
        choose_query()
    assert err.value.exit_code == ExitCode.BACKEND_UNAVAILABLE and "pyslurm cannot be used here" in err.value.message
    monkeypatch.setenv(QUERY_ENV, "fast")
    with pytest.raises(ClusterctlError) as err:
        choose_query()
    assert err.value.exit_code == ExitCode.USAGE and "cli, pyslurm" in err.value.message.replace("auto, ", "")


def test_auto_without_a_slurm_conf_survives(tmp_path: Path) -> None:
    """`import pyslurm` would end the process here; the choice must not even try."""
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf"), QUERY_ENV: "auto"}
    code = "from clusterctl.backends.slurm.choose import choose_query; print(choose_query().name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "cli"), out.stderr


def test_versions_compare_by_major_and_minor() -> None:
    assert pyslurmprobe.major_minor("22.5.3") == pyslurmprobe.major_minor("slurm-wlm 22.05.8\n") == (22, 5)
    assert pyslurmprobe.major_minor("25.11.0") != pyslurmprobe.major_minor("slurm 22.05.8")


def test_normalisation() -> None:
    assert node_state("MIXED+DRAIN") == ("ALLOCATED", ("DRAIN",))
    assert node_state("IDLE+NOT_RESPONDING+DRAIN") == ("IDLE", ("DRAIN", "NOT_RESPONDING"))
    assert node_reason("maintenance window [root@2026-12-01T04:17:40]") == "maintenance window"
    assert node_reason("None") == ""
    assert wait_status(84 << 8) == (84, None) and wait_status(9) == (0, 9)
    assert task_ranges("0-3,7,10-14:2%4") == {0, 1, 2, 3, 7, 10, 12, 14}
    own, array_id, info = parse_squeue_line("47|44_3|RUNNING|n1|0|1|n1|None|") or ("", "", None)
    assert (own, array_id) == ("47", "44_3") and info == JobInfo("44_3", "RUNNING", "", "n1", 0, None, 1, "n1")
    line = "8|8|PENDING||0|0|n/a|Nodes required for job are DOWN, DRAINED | or reserved|"
    assert parse_squeue_line(line)[2].reason == "Nodes required for job are DOWN, DRAINED | or reserved"  # type: ignore[index]
