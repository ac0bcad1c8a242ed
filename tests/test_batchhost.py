"""The batch host's Slurm client (backends/slurm/batchhost.py), and that nothing on the nodes has another.

How the job is ending is read from `scontrol show job -o` lines as Slurm 22.05
prints them; the command runner is replaced, never the parser.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from clusterctl.backends.slurm import batchhost
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

PACKAGE = Path(batchhost.__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
SLURM_COMMANDS = ("scontrol", "sbatch", "scancel", "squeue")


def line(state: str, reason: str = "None", restarts: int = 0) -> str:
    return (f"JobId=5 JobName=train UserId=alice(1000) GroupId=alice(1000) Priority=4294901757 JobState={state}"
            f" Reason={reason} Dependency=(null) Requeue=1 Restarts={restarts} BatchFlag=1 ExitCode=0:0"
            " RunTime=00:01:02 TimeLimit=00:10:00 NodeList=node[1-2] BatchHost=node1 NumNodes=2\n")


class FakeSlurm:
    """Stands in for commands.run: records each call and answers with `reply` (a line, or (exit, stderr))."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.reply: str | tuple[int, str] = ""

    def __call__(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.asked.append(argv)
        if isinstance(self.reply, tuple):
            return subprocess.CompletedProcess(argv, self.reply[0], "", self.reply[1])
        return subprocess.CompletedProcess(argv, 0, self.reply, "")


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm()
    monkeypatch.setattr(batchhost, "run", fake)
    return fake


@pytest.mark.parametrize(("state", "reason", "restarts", "end"), [
    ("RUNNING", "None", 0, "running"),  # the pre-timeout signal, a preemption's warning
    ("COMPLETING", "None", 0, "cancelled"),  # scancel (measured on Slurm 22.05)
    ("CANCELLED", "None", 0, "cancelled"),
    ("PREEMPTED", "None", 0, "preempted"),
    ("TIMEOUT", "None", 0, "timeout"),
    ("COMPLETING", "TimeLimit", 0, "timeout"),
    ("COMPLETING", "None", 1, "requeued"),  # Restarts raised past this run's SLURM_RESTART_COUNT
])
def test_how_slurm_is_ending_the_job(slurm: FakeSlurm, state: str, reason: str, restarts: int, end: str) -> None:
    slurm.reply = line(state, reason, restarts)
    assert batchhost.ending("5", restart_count=0) == end
    assert slurm.asked == [["scontrol", "show", "job", "-o", "5"]]


def test_a_requeued_runs_own_restarts_are_no_new_requeue(slurm: FakeSlurm) -> None:
    slurm.reply = line("COMPLETING", restarts=2)
    assert batchhost.ending("5", batchhost.restart_count({"SLURM_RESTART_COUNT": "2"})) == "cancelled"
    assert batchhost.restart_count({}) == 0 and batchhost.restart_count({"SLURM_RESTART_COUNT": "x"}) == 0


def test_a_job_slurm_cannot_describe_is_taken_as_running(slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch host goes on with what it knows: a forgotten job, or no scontrol at all, is no stop."""
    slurm.reply = (1, "slurm_load_jobs error: Invalid job id specified")
    assert batchhost.job("5") is None and batchhost.ending("5", 0) == "running"

    def missing(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        raise ClusterctlError("scontrol is not on PATH", ExitCode.BACKEND_UNAVAILABLE)

    monkeypatch.setattr(batchhost, "run", missing)
    assert batchhost.ending("5", 0) == "running"


def test_the_job_as_scontrol_describes_it(slurm: FakeSlurm) -> None:
    slurm.reply = line("NODE_FAIL", restarts=3)
    info = batchhost.job("5")
    assert info is not None
    assert (info.state, info.reason, info.nodes, info.requeue_count, info.batch_host) == ("NODE_FAIL", "", "node[1-2]", 3, "node1")


def test_the_continuation_is_submitted_without_the_jobs_own_slurm_variables(slurm: FakeSlurm, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def sbatch(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.update(argv=argv, **kw)
        return subprocess.CompletedProcess(argv, 0, "77;cluster\n", "")

    monkeypatch.setattr(batchhost, "run", sbatch)
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-2]", "SBATCH_EXCLUSIVE": "1", "SLURM_CONF": "/etc/s.conf",
           "PATH": "/usr/bin"}
    assert batchhost.submit_after(tmp_path / "job.sbatch", "5", ["node2", "node3"], env) == "77"
    assert seen["argv"] == ["sbatch", "--parsable", "--dependency=afterany:5", "--exclude=node[2-3]",
                            str(tmp_path / "job.sbatch")]
    assert seen["env"] == {"SLURM_CONF": "/etc/s.conf", "PATH": "/usr/bin"}


def test_a_refused_continuation_says_slurms_reason(slurm: FakeSlurm, tmp_path: Path) -> None:
    slurm.reply = (1, "sbatch: error: Batch job submission failed: Invalid account or account/partition combination")
    with pytest.raises(ClusterctlError) as raised:
        batchhost.submit_after(tmp_path / "job.sbatch", "5", [], {})
    assert "Invalid account" in str(raised.value) and raised.value.exit_code == ExitCode.BACKEND_UNAVAILABLE


def test_a_requeue_keeps_the_runs_avoided_nodes_out_of_the_next_run(slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requeue first, then ExcNodeList (Slurm takes it only once the job is requeued); TERM is ignored meanwhile."""
    ignored: list[object] = []
    monkeypatch.setattr(batchhost.signal, "signal", lambda sig, how: ignored.append((sig, how)))
    assert batchhost.requeue_self("5", ["node2", "node3"]) == ""
    assert slurm.asked == [["scontrol", "requeue", "5"], ["scontrol", "update", "jobid=5", "ExcNodeList=node[2-3]"]]
    assert ignored == [(batchhost.signal.SIGTERM, batchhost.signal.SIG_IGN)]
    slurm.reply = (1, "scontrol: error: Requested operation is presently disabled for job 5")
    with pytest.raises(ClusterctlError, match="scontrol requeue 5 failed: .*presently disabled"):
        batchhost.requeue_self("5", ["node2"])
    assert slurm.asked[-1] == ["scontrol", "requeue", "5"]  # no update of a job that was not requeued


def test_a_requeue_whose_exclusion_is_refused_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batchhost.signal, "signal", lambda *_: None)
    replies = iter([subprocess.CompletedProcess([], 0, "", ""),
                    subprocess.CompletedProcess([], 1, "", "Invalid node name specified")])
    monkeypatch.setattr(batchhost, "run", lambda argv, **_: next(replies))
    assert batchhost.requeue_self("5", ["node9"]) == "the requeued job may run on node9 again: Invalid node name specified"


def _commands_in_shell(text: str) -> list[str]:
    """Slurm commands a script runs: every line's words outside comments (a `#SBATCH` line is sbatch's, no call)."""
    found = []
    for raw in text.splitlines():
        code = raw.split(" # ")[0] if not raw.lstrip().startswith("#") else ""
        found += [f"{name}: {raw.strip()}" for name in SLURM_COMMANDS if re.search(rf"(^|[\s(<$]){name}\s", code)]
    return found


def test_nothing_on_the_nodes_runs_slurm_commands_but_the_batch_hosts_client() -> None:
    """runtime/ calls no Slurm command itself; a managed batch script asks none (the recovery step does, through
    batchhost.py); a standalone one, with no clusterctl on its nodes, only expands its node list."""
    literal = []
    for path in sorted((PACKAGE / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in SLURM_COMMANDS:
                literal.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not literal, "\n".join(literal)
    managed = sorted(GOLDEN.glob("*/managed/job.sbatch"))
    standalone = sorted(GOLDEN.glob("*/standalone/job.sbatch"))
    assert managed and standalone
    for script in managed:
        assert not _commands_in_shell(script.read_text()), script
    for script in standalone:
        assert _commands_in_shell(script.read_text()) == [
            'scontrol: mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")  # standalone: no clusterctl on the nodes'
        ], script
