"""The local backend's Slurm emulation piece by piece: option parsing, layout, the shims as processes.

Expected behaviour is Slurm 22.05's as measured on the test cluster
(tests/slurmlab): srun --label writes `N: text` with N right-aligned to the
width of the largest task id and ends an unterminated last line; srun exits
with the largest task code, 128+signal for killed tasks (also those it killed
for --kill-on-bad-exit, 143, or --wait, 137); TERM to srun kills the step,
USR1/USR2 are forwarded; step nodes follow the job's node order.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.backends.base import JobInfo
from clusterctl.backends.local import BIN_DIR
from clusterctl.backends.local.backend import LocalBackend
from clusterctl.backends.local.batchopts import (
    OptionError,
    directives,
    expand_pattern,
    parse_request,
    parse_signal,
    parse_time,
)
from clusterctl.backends.local.formats import counts_text, even_split, slurm_time
from clusterctl.backends.local.records import next_counter
from clusterctl.backends.local.srunopts import SrunError, expand_counts, layout, parse, split_argv
from clusterctl.backends.slurm.backend import parse_scontrol_job
from clusterctl.plan.job import load_job
from clusterctl.render.scripts import render_run
from clusterctl.syntax.hostlist import compress, expand

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
TEMPLATE_SRUN = [
    "--label", "--kill-on-bad-exit=1", "--wait=60", "--export=ALL", "--nodes=2", "--ntasks=4",
    "--ntasks-per-node=2", "--cpus-per-task=1", "--distribution=block:block", "--nodelist=/tmp/x/hosts",
    "--output=/tmp/x/logs/node-%n.log", "--error=/tmp/x/logs/node-%n.log", "--open-mode=append",
    "bash", "/tmp/x/wrapper.sh",
]


# -- sbatch options ------------------------------------------------------------------------------

def rendered_sbatch(tmp_path: Path) -> str:
    job = load_job(QUICKSTART, overrides=["command=[/bin/true]"])
    return render_run(job.plan, tmp_path / "run", python=sys.executable).files["job.sbatch"]


def test_the_rendered_directives_parse_into_the_request(tmp_path: Path) -> None:
    request = parse_request(rendered_sbatch(tmp_path), [])
    assert (request.name, request.nodes, request.ntasks_per_node, request.cpus_per_task) == ("quickstart", 2, 2, 1)
    assert request.time_limit == 20 * 60 and request.requeue and request.open_mode == "append"
    assert request.signal == {"num": int(signal.SIGUSR2), "name": "USR2", "lead": 60, "batch": True}
    assert request.output == f"{tmp_path}/run/slurm-%j.out" and request.gpus_per_node == 0
    assert request.partition == "local" and not request.exclusive


def test_directives_stop_at_the_first_command_and_the_command_line_wins() -> None:
    script = "#!/bin/bash\n# note\n#SBATCH -N 3 --time=5 # comment\n#SBATCHX --nodes=9\n\necho hi\n#SBATCH --nodes=4\n"
    assert directives(script) == ["-N", "3", "--time=5"]
    request = parse_request(script, ["--nodes=1", "--exclude=node[2-3]", "--dependency=afterany:7:8", "--gres=gpu:a100:2"])
    assert request.nodes == 1 and request.time_limit == 300 and request.exclude == ["node2", "node3"]
    assert request.dependency == [["afterany", 7], ["afterany", 8]] and request.gpus_per_node == 2


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--mem=4G"], "unrecognized option '--mem'"),
        (["--constraint=ib"], "no features"),
        (["--signal=R:USR1@10"], "only the B: flag"),
        (["--dependency=after:3"], "emulates afterany, afterok, afternotok"),
        (["--time=1:2:3:4"], "invalid time limit"),
        (["--export=NONE"], "only ALL"),
        (["--open-mode=keep"], "append or truncate"),
        (["-Z"], "invalid option -- 'Z'"),
    ],
)
def test_options_the_emulation_does_not_support_are_refused(args: list[str], needle: str) -> None:
    with pytest.raises(OptionError, match=re.escape(needle)):
        parse_request("#!/bin/bash\n", args)


def test_times_signals_and_patterns() -> None:
    assert [parse_time(t) for t in ("5", "5:30", "1:00:00", "2-3", "2-03:04", "1-00:00:01", "0", "UNLIMITED")] == [
        300, 330, 3600, 183600, 183840, 86401, None, None]
    assert parse_signal("USR2") == {"num": int(signal.SIGUSR2), "name": "USR2", "lead": 60, "batch": False}
    assert parse_signal("B:SIGTERM@90")["lead"] == 90 and parse_signal("b:10@5")["num"] == 10
    text = expand_pattern("%x-%j-%N-%n-%t-%s-%u-%3t-%%", job_id=42, name="q", user="me", node="node2", task=3,
                          step="0", node_index=1)
    assert text == "q-42-node2-1-3-0-me-003-%"


def test_slurm_counts_and_durations() -> None:
    assert counts_text([2, 2, 2, 1]) == "2(x3),1" and expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert even_split(3, 2) == [2, 1] and even_split(4, 3) == [2, 1, 1] and even_split(8, 4) == [2] * 4
    assert slurm_time(3661) == "01:01:01" and slurm_time(90061) == "1-01:01:01" and slurm_time(None) == "UNLIMITED"


def _count(directory: str, n: int) -> list[int]:
    return [next_counter(Path(directory), "next_job_id", 1) for _ in range(n)]


def test_job_ids_increase_without_repeats_across_processes(tmp_path: Path) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        ids = sum(pool.starmap(_count, [(str(tmp_path), 25)] * 4), [])
    assert sorted(ids) == list(range(1, 101))


# -- srun options and layout ----------------------------------------------------------------------

JOB_ENV = {"SLURM_JOB_NODELIST": "node[1-4]", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NTASKS": "8",
           "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_CPUS_PER_NODE": "2(x4)"}


def test_the_template_srun_line_parses() -> None:
    opts = parse(TEMPLATE_SRUN)
    assert opts.label and opts.kill_bad_exit and opts.wait == 60 and opts.overlap is False
    assert (opts.nodes, opts.ntasks, opts.ntasks_per_node, opts.cpus_per_task) == (2, 4, 2, 1)
    assert opts.output == opts.error == "/tmp/x/logs/node-%n.log" and opts.open_mode == "append"
    assert opts.command == ["bash", "/tmp/x/wrapper.sh"]
    one = parse(["--nodes=1", "--ntasks=1", "--overlap", "--nodelist=node2", "ip", "-o", "-4", "addr"])
    assert one.overlap and one.nodelist == "node2" and one.command == ["ip", "-o", "-4", "addr"]
    pairs, command = split_argv(["-lK", "-N2", "-n", "4", "-W", "5", "--", "-x"])
    assert pairs == [("label", None), ("kill-on-bad-exit", None), ("nodes", "2"), ("ntasks", "4"), ("wait", "5")]
    assert command == ["-x"]


@pytest.mark.parametrize("arg", ["--container-image=nvcr.io#x", "--mpi=pmix", "--gpus-per-task=1", "-X"])
def test_srun_refuses_what_it_does_not_emulate(arg: str) -> None:
    with pytest.raises(SrunError) as info:
        parse([arg, "true"])
    assert info.value.usage and "unrecognized option" in str(info.value)


@pytest.mark.parametrize("args", [["--distribution=cyclic", "true"], ["--export=NONE", "true"], ["--label"]])
def test_srun_refuses_unemulated_values(args: list[str]) -> None:
    with pytest.raises(SrunError):
        parse(args)


def test_step_layout_follows_slurm(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node3\nnode2\n")
    lay = layout(parse([f"--nodelist={hosts}", "-N2", "-n4", "true"]), JOB_ENV, "7")
    assert lay.nodes == ["node2", "node3"] and lay.counts == [2, 2]  # the job's order, not the file's
    assert lay.tasks()[2] == (2, 1, 0)
    lay = layout(parse(["true"]), JOB_ENV, "7")
    assert lay.nodes == expand("node[1-4]") and lay.ntasks == 8
    lay = layout(parse(["-N2", "-n3", "true"]), JOB_ENV, "7")
    assert lay.counts == [2, 1] and "Ignoring --ntasks-per-node" in lay.warnings[0]
    lay = layout(parse(["-N2", "-n1", "true"]), JOB_ENV, "7")
    assert lay.nodes == ["node1"] and "setting nnodes to 1" in lay.warnings[0]
    with pytest.raises(SrunError, match="More processors requested than permitted"):
        layout(parse(["-N1", "-n3", "true"]), JOB_ENV, "7")
    with pytest.raises(SrunError, match="Requested node configuration is not available"):
        layout(parse(["--nodelist=node9", "true"]), JOB_ENV, "7")


# -- srun as a process (a job's environment, no supervisor) -----------------------------------------

def srun(tmp_path: Path, *args: str, nodes: str = "node[1-2]", per_node: int = 2, extra: dict | None = None,
         timeout: float = 30) -> subprocess.CompletedProcess[str]:
    count = len(expand(nodes))
    env = dict(os.environ, SLURM_JOB_ID="77", SLURM_JOB_NAME="t", SLURM_JOB_NODELIST=nodes,
               SLURM_JOB_NUM_NODES=str(count), SLURM_NTASKS_PER_NODE=str(per_node), SLURM_NTASKS=str(count * per_node),
               SLURM_JOB_CPUS_PER_NODE=f"{per_node}(x{count})", CLUSTERCTL_LOCAL_STATE=str(tmp_path / "nostate"),
               CLUSTERCTL_LOCAL_PYTHON=sys.executable, PATH=f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    env.update(extra or {})
    return subprocess.run(["srun", *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def test_label_format_and_unterminated_lines(tmp_path: Path) -> None:
    out = srun(tmp_path, "--label", "-N2", "-n12", "bash", "-c", 'echo "a $SLURM_PROCID"; printf tail',
               per_node=6)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sorted(lines) == sorted([f"{r:>2}: a {r}" for r in range(12)] + [f"{r:>2}: tail" for r in range(12)])
    plain = srun(tmp_path, "-N1", "-n2", "bash", "-c", "printf x$SLURM_PROCID")
    assert sorted(plain.stdout) == sorted("x0x1")  # no label: relayed as is, no newline added


def test_per_node_files_hold_whole_labelled_lines(tmp_path: Path) -> None:
    script = 'for i in $(seq 300); do echo "line $i of task $SLURM_PROCID on $SLURMD_NODENAME"; done; echo err >&2'
    out = srun(tmp_path, "--label", "--output=%N-%j.log", "--error=%N-%j.log", "--open-mode=append",
               "-N2", "-n4", "bash", "-c", script)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    for node, ranks in (("node1", {0, 1}), ("node2", {2, 3})):
        lines = (tmp_path / f"{node}-77.log").read_text().splitlines()
        assert len(lines) == 301 * 2
        for line in lines:
            match = re.fullmatch(r"(\d): (line \d+ of task (\d) on (node\d)|err)", line)
            assert match, line
            assert int(match.group(1)) in ranks and (match.group(3) is None or match.group(3) == match.group(1))


def test_task_environment(tmp_path: Path) -> None:
    out = srun(tmp_path, "-l", "--nodes=2", "--ntasks=4", "--cpus-per-task=1", "python3", "-c",
               "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if 'SLURM' in k or 'VISIBLE' in k}))",
               extra={"SLURM_JOB_GPUS": "0,1"})
    assert out.returncode == 0, out.stderr
    envs = {int(line.split(":")[0]): json.loads(line.split(": ", 1)[1]) for line in out.stdout.splitlines()}
    for rank, env in envs.items():
        assert env["SLURM_PROCID"] == str(rank) and env["SLURM_LOCALID"] == str(rank % 2)
        assert env["SLURM_NODEID"] == str(rank // 2) and env["SLURMD_NODENAME"] == f"node{rank // 2 + 1}"
        assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == env["SLURM_STEP_NUM_TASKS"] == "4"
        assert env["SLURM_NNODES"] == "2" and env["SLURM_STEP_NODELIST"] == "node[1-2]"
        assert env["SLURM_TASKS_PER_NODE"] == env["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
        assert env["SLURM_STEP_ID"] == "0" and env["SLURM_CPUS_PER_TASK"] == "1" and env["SLURM_LABELIO"] == "1"
        assert env["CUDA_VISIBLE_DEVICES"] == env["SLURM_STEP_GPUS"] == "0,1"
        assert env["SLURM_GTIDS"] == ("0,1" if rank < 2 else "2,3")


def test_kill_on_bad_exit_terminates_the_rest(tmp_path: Path) -> None:
    start = time.monotonic()
    out = srun(tmp_path, "--label", "--kill-on-bad-exit=1", "-N2", "-n4", "bash", "-c",
               'if [ "$SLURM_PROCID" = 3 ]; then sleep 0.2; exit 3; fi; exec sleep 30')
    assert time.monotonic() - start < 5
    assert out.returncode == 143  # 22.05: max(3, 128+SIGTERM of the others)
    err = out.stderr
    assert err.index("srun: error: node2: task 3: Exited with exit code 3") < err.index("Terminating StepId=77.0")
    assert "Terminated" in err
    trapped = srun(tmp_path, "--kill-on-bad-exit", "-N2", "-n4", "bash", "-c",
                   'trap "exit 0" TERM; if [ "$SLURM_PROCID" = 3 ]; then sleep 0.2; exit 3; fi; sleep 30 & wait')
    assert trapped.returncode == 3  # the others exited 0 on SIGTERM


def test_wait_kills_the_rest_after_the_first_task_ends(tmp_path: Path) -> None:
    start = time.monotonic()
    out = srun(tmp_path, "--wait=5", "-N2", "-n4", "bash", "-c", '[ "$SLURM_PROCID" = 1 ] && exit 0; exec sleep 30',
               extra={"CLUSTERCTL_LOCAL_TIME_SCALE": "0.1"})
    assert 0.3 < time.monotonic() - start < 5
    assert out.returncode == 137
    assert "First task exited 5s ago" in out.stderr and "StepId=77.0 tasks 0,2-3: running" in out.stderr


def srun_popen(tmp_path: Path, script: str) -> subprocess.Popen[str]:
    """`srun -l -n2 bash -c SCRIPT` on one emulated node, its output on pipes."""
    env = dict(os.environ, SLURM_JOB_ID="78", SLURM_JOB_NODELIST="node1", SLURM_JOB_NUM_NODES="1",
               SLURM_JOB_CPUS_PER_NODE="2", CLUSTERCTL_LOCAL_STATE=str(tmp_path / "nostate"),
               CLUSTERCTL_LOCAL_PYTHON=sys.executable, PATH=f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    return subprocess.Popen(["srun", "-l", "-n2", "bash", "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_signals_to_srun(tmp_path: Path) -> None:
    # After `ready` a task runs builtins and short sleeps only: a forwarded signal goes to every process
    # of the step, so USR1 kills whatever child a task runs at that moment (see the next test).
    script = 'trap "echo got USR1" USR1; echo ready; for ((i = 0; i < 300; i++)); do sleep 0.1; done'
    proc = srun_popen(tmp_path, script)
    assert proc.stdout is not None
    assert sorted([proc.stdout.readline(), proc.stdout.readline()]) == ["0: ready\n", "1: ready\n"]
    proc.send_signal(signal.SIGUSR1)  # forwarded to every task
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # forces termination (SIGKILL to the step), as srun does
    out, err = proc.communicate(timeout=10)
    assert out.count("got USR1") == 2, (out, err)
    assert proc.returncode == 137 and "forcing job termination" in err, (proc.returncode, out, err)


def test_forwarded_signals_reach_the_tasks_children(tmp_path: Path) -> None:
    """USR1 to srun goes to every process of the step (slurmstepd signals the step's whole cgroup).

    Here each task's shell waits for a command substitution that has just
    said `ready` from inside it: the signal kills that subshell (a subshell
    does not inherit the shell's trap), the loop gets an empty list and the
    task ends at once with code 0. This is what once made the test above exit
    0 under load, when its loop list still came from `$(seq 300)` computed just
    after `echo ready`.
    """
    script = 'trap "echo got USR1" USR1; exec 3>&1; for i in $(echo ready >&3; sleep 30; echo late); do echo "$i"; done; echo done'
    proc = srun_popen(tmp_path, script)
    assert proc.stdout is not None
    assert sorted([proc.stdout.readline(), proc.stdout.readline()]) == ["0: ready\n", "1: ready\n"]
    start = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=20)
    assert time.monotonic() - start < 10 and proc.returncode == 0, (proc.returncode, out, err)
    assert sorted(out.splitlines()) == ["0: done", "0: got USR1", "1: done", "1: got USR1"], out


def test_term_as_soon_as_the_tasks_exist_kills_the_step(tmp_path: Path) -> None:
    """srun's handlers are in place before its first task starts: TERM then still ends the step with 137."""
    proc = srun_popen(tmp_path, "sleep 30")
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 20
    while not children.read_text().split():
        assert time.monotonic() < deadline and proc.poll() is None, "srun started no task"
        time.sleep(0.001)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 137 and "forcing job termination" in err, (proc.returncode, out, err)


def test_unknown_options_exit_255_and_a_missing_command_fails(tmp_path: Path) -> None:
    out = srun(tmp_path, "--container-image=nvcr.io#pytorch", "true")
    assert out.returncode == 255 and out.stderr.startswith("srun: error: unrecognized option '--container-image")
    out = srun(tmp_path, "-n1", "no-such-command-here")
    assert out.returncode == 2 and "execve(): no-such-command-here" in out.stderr + out.stdout


def test_64_tasks_start_cheaply(tmp_path: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = srun(tmp_path, "--label", "-N4", "-n64", "true", nodes="node[1-4]", per_node=16)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert out.returncode == 0, out.stderr
    assert cpu < 1.0 and wall < 3.0, (cpu, wall)


# -- scontrol, sbatch, squeue, scancel against real jobs --------------------------------------------

@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    root = tmp_path / "state"
    monkeypatch.setenv("CLUSTERCTL_LOCAL_STATE", str(root))
    monkeypatch.setenv("CLUSTERCTL_LOCAL_PYTHON", sys.executable)
    monkeypatch.setenv("PATH", f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CLUSTERCTL_LOCAL_NODES", raising=False)
    monkeypatch.delenv("CLUSTERCTL_LOCAL_TIME_SCALE", raising=False)
    monkeypatch.delenv("CLUSTERCTL_LOCAL_REQUEUE_DELAY", raising=False)
    for name in [n for n in os.environ if n.startswith(("SLURM_", "SBATCH_"))]:
        monkeypatch.delenv(name)  # a job's own variables would point the shims at it
    monkeypatch.chdir(tmp_path)
    yield root
    backend = LocalBackend()
    ids = [p.name for p in (root / "jobs").glob("*")] if (root / "jobs").is_dir() else []
    for job_id in ids:
        backend.cancel(job_id)
    for job_id in ids:
        finished(job_id, 15)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


def finished(job_id: str, timeout: float = 20) -> JobInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = LocalBackend().info(job_id)
        if info is not None and info.finished:
            return info
        assert time.monotonic() < deadline, f"job {job_id}: {info}"
        time.sleep(0.05)


def script(tmp_path: Path, name: str, body: str, *directives_: str) -> Path:
    path = tmp_path / name
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives_), body]
    path.write_text("\n".join(lines) + "\n")
    return path


ENV_DUMP = 'env | grep -E "^(SLURM|SLURMD|CUDA_VISIBLE)" | sort > "env-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}.txt"'


def env_file(tmp_path: Path, job_id: str, restart: int = 0) -> dict[str, str]:
    text = (tmp_path / f"env-{job_id}-{restart}.txt").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def test_scontrol_hostnames_and_hostlist(state: Path) -> None:
    out = run("scontrol", "show", "hostnames", "rack[1-2]-n[01-02],login")
    assert out.stdout.split() == expand("rack[1-2]-n[01-02],login")
    assert run("scontrol", "show", "hostlist", "n3,n1,n2,n4").stdout.strip() == compress(["n3", "n1", "n2", "n4"])
    env_out = subprocess.run(["scontrol", "show", "hostnames"], capture_output=True, text=True,
                             env=dict(os.environ, SLURM_JOB_NODELIST="node[2-3]"))
    assert env_out.stdout.split() == ["node2", "node3"]
    assert run("scontrol", "show", "job", "-o", "4242").returncode == 1
    assert run("scontrol", "frobnicate").returncode == 1


def test_batch_environment_and_show_job(state: Path, tmp_path: Path) -> None:
    path = script(tmp_path, "gpu.sh", ENV_DUMP + '\nsrun -l bash -c "echo \\$CUDA_VISIBLE_DEVICES \\$SLURM_STEP_GPUS"',
                  "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2", "--time=5", "--job-name=gpu",
                  "--output=out-%j.txt")
    out = run("sbatch", "--parsable", str(path))
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    info = finished(job_id)
    assert (info.state, info.exit_code) == ("COMPLETED", 0)
    env = env_file(tmp_path, job_id)
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == job_id and env["SLURM_JOB_NAME"] == "gpu"
    assert env["SLURM_JOB_NODELIST"] == "node[1-2]" and env["SLURM_NNODES"] == env["SLURM_JOB_NUM_NODES"] == "2"
    assert env["SLURM_NTASKS_PER_NODE"] == "2" and env["SLURMD_NODENAME"] == "node1"
    assert env["SLURM_SUBMIT_DIR"] == str(tmp_path) and env["SLURM_JOB_GPUS"] == env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "SLURM_RESTART_COUNT" not in env
    assert sorted((tmp_path / f"out-{job_id}.txt").read_text().splitlines()) == [f"{r}: 0,1 0,1" for r in range(4)]
    show = run("scontrol", "show", "job", "-o", job_id).stdout
    assert parse_scontrol_job(show) == LocalBackend().info(job_id)  # the Slurm backend's parser reads it the same
    assert " TimeLimit=00:05:00 " in show and " TresPerNode=gres:gpu:2 " in show and " BatchHost=node1 " in show


def test_continuation_job_waits_for_its_dependency_and_avoids_excluded_nodes(state: Path, tmp_path: Path) -> None:
    first = run("sbatch", "--parsable", str(script(tmp_path, "a.sh", "sleep 1.5; " + ENV_DUMP, "--nodes=1")))
    first_id = first.stdout.strip()
    second = run("sbatch", "--parsable", f"--dependency=afterany:{first_id}", "--exclude=node1",
                 str(script(tmp_path, "b.sh", ENV_DUMP, "--nodes=1")))
    second_id = second.stdout.strip()
    assert int(second_id) == int(first_id) + 1
    assert run("squeue", "-h", "-j", second_id, "-o", "%T %r").stdout.split() == ["PENDING", "Dependency"]
    assert finished(second_id).state == "COMPLETED"
    env = env_file(tmp_path, second_id)
    assert env["SLURMD_NODENAME"] == "node2"
    a_end = json.loads((state / "jobs" / first_id / "state.json").read_text())["end_time"]
    b_start = json.loads((state / "jobs" / second_id / "state.json").read_text())["start_time"]
    assert b_start >= a_end
    assert run("squeue", "-h", "-j", second_id, "-o", "%T").stdout == ""  # finished jobs leave squeue's default view
    assert run("squeue", "-h", "-t", "all", "-j", second_id, "-o", "%T").stdout.strip() == "COMPLETED"
    assert run("squeue", "-h", "-j", "999").returncode == 1


def test_scancel_batch_signal_and_requeue_from_inside(state: Path, tmp_path: Path) -> None:
    body = ENV_DUMP + """
trap 'echo "batch got USR1"' USR1
if [ -z "${SLURM_RESTART_COUNT:-}" ]; then
  echo ready > ready-$SLURM_JOB_ID
  while [ ! -e go ]; do sleep 0.05; done
  scontrol requeue $SLURM_JOB_ID
  sleep 30 & wait
fi
echo "run ${SLURM_RESTART_COUNT:-0} done"
"""
    path = script(tmp_path, "r.sh", body, "--output=r.out", "--open-mode=append")
    job_id = run("sbatch", "--parsable", str(path)).stdout.strip()
    deadline = time.monotonic() + 15
    while not (tmp_path / f"ready-{job_id}").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert run("scancel", "--signal=USR1", "--batch", job_id).returncode == 0
    assert run("scontrol", "requeue", "4242").returncode == 1
    assert "no longer pending" in run("scontrol", "update", f"jobid={job_id}", "ExcNodeList=node2").stderr
    (tmp_path / "go").touch()
    info = finished(job_id)
    assert info.state == "COMPLETED"
    out = (tmp_path / "r.out").read_text()
    assert "batch got USR1" in out and "DUE TO JOB REQUEUE" in out and "run 1 done" in out
    assert env_file(tmp_path, job_id, 1)["SLURM_RESTART_COUNT"] == "1"
    assert run("scancel", job_id).returncode == 0  # a finished job: nothing to do, no error (as in 22.05)


def test_cancel_waits_killwait_for_a_batch_shell_that_ignores_sigterm(state: Path, tmp_path: Path) -> None:
    body = 'trap "" TERM; echo $$ > pid; while true; do sleep 0.1; done'
    job_id = run("sbatch", "--parsable", str(script(tmp_path, "stubborn.sh", body))).stdout.strip()
    deadline = time.monotonic() + 10
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    start = time.monotonic()
    LocalBackend().cancel(job_id)
    info = finished(job_id)
    assert info.state == "CANCELLED" and 1.8 <= time.monotonic() - start < 6  # SIGKILL after KillWait (2 s)
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    show = run("scontrol", "show", "job", "-o", job_id).stdout
    assert " ExitCode=0:9 " in show


SAVES_ON_TERM = """trap 'echo "batch got TERM" >> batch.txt' TERM
srun --nodes=2 --ntasks=2 bash -c 'trap "sleep 1.5; echo saved > saved-$SLURM_PROCID; exit 0" TERM
  touch ready-$SLURM_PROCID; sleep 60 & wait' &
while true; do wait; done
"""
"""A batch script whose step's tasks take 1.5 s to save on SIGTERM (inside KillWait, 2 s): what a rank's stop does."""


def test_the_jobs_sigterm_lets_a_steps_tasks_save_within_killwait(state: Path, tmp_path: Path) -> None:
    """scancel: srun gets the TERM too and says it forces termination, yet its tasks have the job's KillWait (as measured)."""
    job_id = run("sbatch", "--parsable", str(script(tmp_path, "save.sh", SAVES_ON_TERM, "--nodes=2",
                                                     "--output=save.out"))).stdout.strip()
    deadline = time.monotonic() + 15
    while not all((tmp_path / f"ready-{i}").exists() for i in (0, 1)):
        assert time.monotonic() < deadline, (tmp_path / "save.out").read_text()
        time.sleep(0.05)
    LocalBackend().cancel(job_id)
    assert finished(job_id).state == "CANCELLED"
    out = (tmp_path / "save.out").read_text()
    assert [(tmp_path / f"saved-{i}").exists() for i in (0, 1)] == [True, True], out
    assert "forcing job termination" in out and (tmp_path / "batch.txt").read_text() == "batch got TERM\n"


def test_signal_without_b_goes_to_the_steps_and_the_limit_ends_in_timeout(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERCTL_LOCAL_TIME_SCALE", "0.05")  # --time=1: 3 s, USR1 40 s before: at 1 s
    body = 'srun -l bash -c \'trap "echo step got USR1" USR1; for i in $(seq 100); do sleep 0.1; done\' &\nwait; wait'
    job_id = run("sbatch", "--parsable", str(script(tmp_path, "steps.sh", body, "--time=1", "--signal=USR1@40",
                                                      "--output=steps.out"))).stdout.strip()
    info = finished(job_id)
    assert info.state == "TIMEOUT"  # the batch shell has no USR1 trap: had it got USR1, it would have died (FAILED)
    out = (tmp_path / "steps.out").read_text()
    assert "0: step got USR1" in out and "DUE TO TIME LIMIT" in out


def test_dependencies_that_cannot_be_met_stay_pending_until_cancelled(state: Path, tmp_path: Path) -> None:
    failing = run("sbatch", "--parsable", str(script(tmp_path, "f.sh", "exit 3"))).stdout.strip()
    assert finished(failing).state == "FAILED" and LocalBackend().info(failing).exit_code == 3
    waiting = run("sbatch", "--parsable", f"--dependency=afterok:{failing}", str(script(tmp_path, "w.sh", "true"))).stdout.strip()
    deadline = time.monotonic() + 10
    while LocalBackend().info(waiting).reason != "DependencyNeverSatisfied":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert run("scontrol", "requeue", waiting).returncode == 1  # pending: "Job is pending execution"
    assert run("scancel", waiting).returncode == 0
    assert finished(waiting).state == "CANCELLED"
    rejected = run("sbatch", "--dependency=afterany:4242", str(tmp_path / "w.sh"))
    assert rejected.returncode == 1 and "Job dependency problem" in rejected.stderr


def test_a_lost_supervisor_shows_as_node_fail(state: Path, tmp_path: Path) -> None:
    job_id = run("sbatch", "--parsable", str(script(tmp_path, "s.sh", "echo $$ > pid; sleep 30"))).stdout.strip()
    deadline = time.monotonic() + 10
    while LocalBackend().info(job_id).state != "RUNNING" or not (tmp_path / "pid").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    record = json.loads((state / "jobs" / job_id / "state.json").read_text())
    os.kill(record["supervisor_pid"], signal.SIGKILL)
    try:
        deadline = time.monotonic() + 10
        while LocalBackend().info(job_id).state != "NODE_FAIL":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert LocalBackend().info(job_id).finished
    finally:
        os.killpg(record["batch_pid"], signal.SIGKILL)  # nobody else will: the job's keeper is gone


def test_label_width_in_files_per_node_follows_the_nodes_task_count(tmp_path: Path) -> None:
    """Measured on Slurm 22.05: srun pads to the step's largest id, slurmstepd's per-node files to the node's."""
    out = srun(tmp_path, "-l", "-N2", "-n16", "--output=all.log", "bash", "-c", "echo t", per_node=8)
    assert out.returncode == 0, out.stderr
    assert sorted((tmp_path / "all.log").read_text().splitlines()) == sorted(f"{r:>2}: t" for r in range(16))
    out = srun(tmp_path, "-l", "-N2", "-n16", "--output=node-%n.log", "bash", "-c", "echo t", per_node=8)
    assert out.returncode == 0, out.stderr
    assert sorted((tmp_path / "node-1.log").read_text().splitlines()) == sorted(f"{r}: t" for r in range(8, 16))
    assert sorted((tmp_path / "node-0.log").read_text().splitlines()) == sorted(f"{r}: t" for r in range(8))


def test_a_finished_job_can_be_requeued(state: Path, tmp_path: Path) -> None:
    job_id = run("sbatch", "--parsable", str(script(tmp_path, "once.sh", ENV_DUMP, "--exclude=node1"))).stdout.strip()
    assert finished(job_id).state == "COMPLETED"
    assert run("scontrol", "requeue", job_id).returncode == 0
    info = LocalBackend().info(job_id)
    assert info is not None and info.state == "PENDING" and info.reason == "BeginTime"
    assert finished(job_id).state == "COMPLETED"
    env = env_file(tmp_path, job_id, 1)
    assert env["SLURM_RESTART_COUNT"] == "1" and env["SLURMD_NODENAME"] == "node2"
    assert "Restarts=1 " in run("scontrol", "show", "job", "-o", job_id).stdout
