"""Warm processes and in-memory snapshots (runtime/node/warm/, checkpoint/snapshots.py), with real processes and signals.

The first tests run a warm process server that imports nothing heavy
(`--only`) and ask it for children the way a rank does: the child has the
client's environment, directory and streams, signals pass through, a client
killed takes its child along, the injector's token check reaches a forked
rank, and where the server cannot serve the command starts cold and says
why. The end-to-end tests run the reference trainer with
`checkpoint.memory_interval: 1`: a killed rank's restart is forked warm and
resumes from the newest step every rank holds in memory, with the losses of
a run that was never interrupted, bitwise at 4 ranks (FSDP2 on the local
backend, DDP on the Slurm test cluster); a lost node's, a hung rank's (the cluster) and a
straggler's (local) ranks resume on the spare from the replicas their peers
hold; a server that dies while importing leaves a job
that runs cold with the reason in every rank's record.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_recovery_e2e import drill, first_step, losses, nothing_left, same_as_uninterrupted, story, submit, wait_for

from clusterctl import envnames, rundir
from clusterctl.rundir import RunDir, rankmanifest

PY = sys.executable


@pytest.fixture()
def server(tmp_path: Path):
    """A warm process server for node `nodeA` that pre-imports only json; yields the environment its clients need."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_")}
    env.update({envnames.WARM: f"clusterctl-test.{secrets.token_hex(6)}", "SLURMD_NODENAME": "nodeA",
                envnames.WARM_SINCE: str(time.time())})
    proc = subprocess.Popen([PY, "-m", "clusterctl.runtime.node.warm.server", "--only", "--import", "json"], env=env,
                            stderr=open(tmp_path / "server.log", "w"))
    try:
        yield env, proc
    finally:
        proc.kill()
        proc.wait(10)


def client(env: dict[str, str], code: str, **kwargs: Any) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "clusterctl.runtime.node.warm.client", "--", PY, "-c", code], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def parent_of(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 2:].split()[1])


def test_a_forked_child_has_the_clients_environment_directory_streams_and_exit_code(server, tmp_path: Path) -> None:
    env, proc = server
    code = ("import os, sys, json; print(json.dumps({'pid': os.getpid(), 'ppid': os.getppid(), 'cwd': os.getcwd(),"
            " 'x': os.environ.get('X'), 'start': os.environ.get('CLUSTERCTL_START'), 'line': sys.stdin.readline()}));"
            " print('to stderr', file=sys.stderr); sys.exit(7)")
    child = client({**env, "X": "it's mine"}, code, cwd=tmp_path, stdin=subprocess.PIPE)
    out, err = child.communicate("a line from stdin\n", timeout=60)
    assert child.returncode == 7, err
    seen = json.loads(out)
    assert seen["ppid"] == proc.pid and seen["pid"] != child.pid  # forked by the server, not started by the client
    assert (seen["cwd"], seen["x"], seen["line"]) == (str(tmp_path), "it's mine", "a line from stdin\n")
    assert seen["start"].startswith("warm: forked by pid") and "on nodeA" in seen["start"]
    assert "to stderr" in err


def test_signals_reach_the_child_and_a_killed_client_takes_it_along(server) -> None:
    env, _ = server
    code = ("import os, signal, time; signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True));"
            " print(os.getpid(), flush=True); time.sleep(60)")
    first = client(env, code)
    pid = int(first.stdout.readline())
    first.send_signal(signal.SIGUSR1)
    assert first.stdout.readline().strip() == "usr1"
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == -signal.SIGTERM  # the child died of it, and so does its stand-in
    second = client(env, code)
    pid = int(second.stdout.readline())
    second.kill()  # what srun does to a task in the end
    second.wait(10)
    wait_for("the child of a killed client to go", lambda: not Path(f"/proc/{pid}").exists() or
             Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z", 10)


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_ps_names_the_forked_rank_by_its_script_and_rank_and_the_stand_in_as_a_stand_in(server, tmp_path: Path) -> None:
    """A user looking for rank 3 in `ps` finds the rank, not the server's command line; the stand-in names the rank's pid."""
    env, _ = server
    script = tmp_path / "train.py"
    script.write_text("import os, time; print(os.getpid(), flush=True); time.sleep(60)\n")
    rank = subprocess.Popen([PY, "-m", "clusterctl.runtime.node.warm.client", "--", PY, "-m", "clusterctl.launch", "--",
                             "python3", str(script), "--lr", "0.1"], env={**env, "RANK": "3"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = int(rank.stdout.readline())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        # As much as the room the server's own command line left (this one's is short: no --run-dir).
        assert f"clusterctl rank 3: python3 {script} --lr 0.1".startswith(cmdline) and len(cmdline) > 40, cmdline
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "train.py:3"
        wait_for("the stand-in's name", lambda: Path(f"/proc/{rank.pid}/comm").read_text().strip() == "stand-in:3", 10)
        stand_in = Path(f"/proc/{rank.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        assert stand_in.startswith(f"clusterctl stand-in for rank 3 (the rank is pid {pid} on nodeA): python3 {script}")
    finally:
        rank.kill()
        rank.wait(10)


def test_a_stop_sent_to_the_stand_in_stops_the_rank_and_a_continue_continues_it(server, tmp_path: Path) -> None:
    """SIGSTOP cannot be caught and passed on: the server sees its client stopped and stops the child (it used to run
    on, finish, and leave a stopped task that srun killed 60 s later: a false 84)."""
    env, _ = server
    ticks = tmp_path / "ticks"
    rank = client(env, f"import os, time\nprint(os.getpid(), flush=True)\nwhile True:\n"
                       f"    open({str(ticks)!r}, 'a').write('.')\n    time.sleep(0.05)\n")
    try:
        pid = int(rank.stdout.readline())
        rank.send_signal(signal.SIGSTOP)
        wait_for("the rank to be stopped with its stand-in", lambda: state_of(pid) == "T", 5)
        seen = ticks.read_text()
        time.sleep(0.5)
        assert ticks.read_text() == seen  # it does not run on
        rank.send_signal(signal.SIGCONT)
        wait_for("the rank to run again", lambda: len(ticks.read_text()) > len(seen), 5)
        assert "the stand-in (pid" in (tmp_path / "server.log").read_text()
    finally:
        rank.kill()
        rank.wait(10)


def test_the_jobs_sigterm_lets_a_forked_child_finish_its_save_before_the_server_goes(server, tmp_path: Path) -> None:
    """Slurm signals the servers' step with the ranks': the server stays until its child, saving for 1.5 s, ends."""
    env, proc = server
    saved = tmp_path / "saved"
    code = ("import os, signal, sys, time\n"
            "def stop(*_):\n"
            "    time.sleep(1.5)\n"  # a save that takes longer than a second
            f"    open({str(saved)!r}, 'w').write('step 4')\n"
            "    sys.exit(85)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "print(os.getpid(), flush=True)\n"
            "time.sleep(60)\n")
    rank = client(env, code)
    pid = int(rank.stdout.readline())
    proc.send_signal(signal.SIGTERM)  # the servers' step and the ranks' are signalled together
    rank.send_signal(signal.SIGTERM)
    assert rank.wait(30) == 85, rank.stderr.read()  # the stop's own exit, not the server's death
    assert saved.read_text() == "step 4"
    assert proc.wait(10) == 0  # and the server left after its last child
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    assert "the job's SIGTERM: serving 1 child(ren) until they end" in (tmp_path / "server.log").read_text()


def test_a_server_with_no_child_leaves_at_once_on_the_jobs_sigterm(server) -> None:
    _, proc = server
    wait_for("the server to listen", lambda: subprocess.run(
        [PY, "-m", "clusterctl.runtime.node.warm.client", "--", PY, "-c", "pass"], env=server[0], capture_output=True
    ).returncode == 0, 30)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_the_injector_checks_a_forked_ranks_token_with_its_server(server) -> None:
    env, _ = server
    child = client({**env, envnames.TOKEN: "right"}, "import os, time; print(os.getpid(), flush=True); time.sleep(60)")
    pid = int(child.stdout.readline())
    inject = [PY, "-m", "clusterctl.qualify.faultsignal", "--pid", str(pid), "--kill"]
    refused = subprocess.run([*inject, "--token", "wrong"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and json.loads(refused.stdout)["reason"] == "token"
    done = subprocess.run([*inject, "--token", "right"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert child.wait(30) == -signal.SIGKILL  # the stand-in ends as its rank did: srun sees a killed task


def test_where_the_server_cannot_serve_the_command_starts_cold_and_says_why(server) -> None:
    env, _ = server
    show = "import os; print(os.environ['CLUSTERCTL_START'])"
    differs = client({**env, "PYTHONHASHSEED": "3"}, show)
    assert differs.communicate(timeout=60)[0].strip() == (
        "cold: PYTHONHASHSEED differs from the warm process server's ('3', not None)")
    elsewhere = client({**env, "SLURMD_NODENAME": "nodeB", envnames.WARM_SINCE: "0"}, show)
    assert elsewhere.communicate(timeout=60)[0].strip() == "cold: no warm process server on nodeB (Connection refused)"
    unnamed = client({k: v for k, v in env.items() if k != envnames.WARM}, show)
    assert unnamed.communicate(timeout=60)[0].strip() == "cold: no warm process servers in this job"


def test_ready_is_answered_once_the_servers_imports_are_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An elastic run's full-size job stops the shrunk one only once its servers have imported (take_over)."""
    from clusterctl.runtime.node.warm import client as warmclient

    (tmp_path / "slow_import.py").write_text(
        f"import pathlib, time\ntime.sleep(1.5)\npathlib.Path({str(tmp_path / 'imported')!r}).write_text('done')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_")}
    env.update({envnames.WARM: f"clusterctl-test.{secrets.token_hex(6)}", "SLURMD_NODENAME": "nodeA",
                envnames.WARM_SINCE: str(time.time()), "PYTHONPATH": f"{tmp_path}:{env.get('PYTHONPATH', '')}"})
    proc = subprocess.Popen([PY, "-m", "clusterctl.runtime.node.warm.server", "--only", "--import", "slow_import"],
                            env=env, stderr=open(tmp_path / "server.log", "w"))
    try:
        for key in (envnames.WARM, "SLURMD_NODENAME", envnames.WARM_SINCE):
            monkeypatch.setenv(key, env[key])
        assert warmclient.wait_ready() == ""
        assert (tmp_path / "imported").read_text() == "done"  # not answered before the import ended
        monkeypatch.setenv("SLURMD_NODENAME", "nodeB")
        monkeypatch.setenv(envnames.WARM_SINCE, "0")
        assert warmclient.wait_ready() == "no warm process server on nodeB (Connection refused)"
    finally:
        proc.kill()
        proc.wait(10)


STRANGER = "ccstranger"  # test_access's second user
LISTEN_AS_STRANGER = r"""
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind("\0" + sys.argv[1])
sock.listen(4)
print("listening", flush=True)
conn, _ = sock.accept()
conn.settimeout(5)
got = b""
try:
    while chunk := conn.recv(65536):
        got += chunk
except OSError:
    pass
print(len(got), flush=True)
"""


def test_a_warm_socket_a_stranger_took_first_is_told_nothing_and_the_rank_starts_cold(tmp_path: Path) -> None:
    """An abstract socket's name is anyone's to take: the client's request carries the rank's environment (the
    attempt token, secret_env). It now asks the kernel who listens, and talks only to its own user's server."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("running a listener as another user needs root and runuser")
    if subprocess.run(["id", STRANGER], capture_output=True, check=False).returncode != 0:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", STRANGER], check=True)
    prefix = f"clusterctl-test.{secrets.token_hex(6)}"
    stranger = subprocess.Popen(["runuser", "-u", STRANGER, "--", "/usr/bin/python3", "-c", LISTEN_AS_STRANGER,
                                 f"{prefix}.nodeA"], stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert stranger.stdout.readline().strip() == "listening"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_")}
        env.update({envnames.WARM: prefix, "SLURMD_NODENAME": "nodeA", envnames.WARM_SINCE: str(time.time()),
                    envnames.TOKEN: "the-attempt-secret"})
        said = client(env, "import os; print(os.environ['CLUSTERCTL_START'])").communicate(timeout=60)[0].strip()
        assert said.startswith("cold: the warm process server's socket on nodeA is not to be trusted: it is held by"
                               " uid "), said
        assert stranger.stdout.readline().strip() == "0"  # the stranger heard nothing: no environment, no token
    finally:
        stranger.kill()
        stranger.wait(10)


# --- snapshots: a copy killed half-way ----------------------------------------------
def test_a_snapshot_copy_killed_half_way_leaves_the_previous_ones_whole(tmp_path: Path) -> None:
    from clusterctl.checkpoint.snapshots import steps_in

    code = ("import sys; from pathlib import Path; from clusterctl.checkpoint.snapshots import write_whole;"
            " d = Path(sys.argv[1]); write_whole(d, 1, b'one'); write_whole(d, 2, b'two'); print('ready', flush=True);"
            " write_whole(d, 3, b'x' * (1 << 29))")  # 512 MiB: still being written when it is killed
    proc = subprocess.Popen([PY, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while not any(p.name.startswith(".tmp-3-") for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.002)
    proc.kill()
    proc.wait(10)
    whole = steps_in(tmp_path)
    assert sorted(whole) == [1, 2] and whole[2].read_bytes() == b"two"


# --- end to end: the reference trainer -------------------------------------------------------------------------
def starts(run: RunDir, attempt: int) -> list[str]:
    return [str(r.get("start")) for r in rankmanifest.iter_ranks(run.attempt(attempt) / rundir.MANIFEST)]


def test_a_killed_rank_restarts_warm_from_the_memory_snapshot_with_the_uninterrupted_losses(
    backend: str, tmp_path: Path
) -> None:
    """DDP at 8 ranks here (2 nodes x 4) and 4 on the cluster: 2 would sum any bucket layout the same
    (trainer/buckets.py); FSDP2's sharded state restarts warm in the lost node's test."""
    steps, gpn = 40, 4 if backend == "local" else 2
    memory = {"gpus_per_node": gpn,
              "checkpoint": {"interval": 100, "memory_interval": 1},  # no durable checkpoint before the kill
              "command": ["python3", "-m", "clusterctl.trainer", "--steps", str(steps), "--eval-interval", "0",
                          "--step-compute-s", "0.05"]}
    done = submit(backend, tmp_path, "warm-kill", **memory)
    run = done.run
    wait_for("step 12", lambda: max(losses(run, 1), default=-1) >= 12, run=run)
    report = drill(run, "--kill", "1")
    assert report["culprit_right"], report
    resumed = first_step(run, 2)
    reached = max(losses(run, 1))
    assert reached - (resumed - 1) <= 1, story(run)  # at most the step in flight is computed again
    record = json.loads((run.attempt(2) / rundir.RECORD).read_text())["recovery"]
    assert record["how"] == f"resumed from the in-memory snapshot of step {resumed - 1}", record
    assert all(s.startswith("warm") for s in starts(run, 2)), starts(run, 2)
    last = 2
    if backend == "local":  # a second fault right after the warm restart: a third attempt, warm again
        wait_for("attempt 2 under way", lambda: max(losses(run, 2), default=-1) >= resumed + 2, run=run)
        assert drill(run, "--kill", str(gpn + 1))["culprit_right"]  # the other node's: one blamed twice is excluded
        again = first_step(run, 3)
        assert max(losses(run, 2)) - (again - 1) <= 1 and all(s.startswith("warm") for s in starts(run, 3))
        last = 3
    wait_for("the run to finish", lambda: max(losses(run, last), default=-1) == steps - 1, run=run)
    same_as_uninterrupted(backend, tmp_path, run, last, steps, memory)
    nothing_left(backend, run)
    for attempt in range(2, last + 1):  # a load from memory, measured, and no bound for a later one from disk
        measured = rundir.read_json(run.attempt(attempt) / rundir.PHASE_TIMES) or {}
        assert measured.get("load_from") == "memory" and measured["load"] >= 0, measured


def test_a_server_that_dies_while_importing_leaves_a_job_that_runs_cold_and_says_why(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "dies_on_import.py").write_text("import os\nos._exit(3)\n")
    done = submit("local", tmp_path, "warm-dies", steps=2, nodes=1, env={"PYTHONPATH": str(project)},
                  restart={"preimport": ["dies_on_import"]})
    run = done.run
    wait_for("the run to finish", lambda: max(losses(run, 1), default=-1) == 1, run=run)
    for start in starts(run, 1):
        assert start.startswith("cold: ") and ("did not fork" in start or "has ended" in start), start


def test_a_lost_nodes_ranks_resume_on_the_spare_from_the_replicas_their_peers_hold(tmp_path: Path) -> None:
    """8 FSDP2 ranks (2 nodes x 4), each holding its own shard: the emulated nodes share one /dev/shm, so the lost
    node's own directory is deleted and only peers can serve; the losses are bitwise an uninterrupted run's."""
    steps = 30
    spec = {"spares": 1, "gpus_per_node": 4,
            "checkpoint": {"interval": 100, "memory_interval": 1},
            "command": ["python3", "-m", "clusterctl.trainer", "--steps", str(steps), "--eval-interval", "0",
                        "--step-compute-s", "0.02", "--parallel", "fsdp"]}
    done = submit("local", tmp_path, "warm-spare", steps=steps, **spec)
    run = done.run
    wait_for("step 12", lambda: max(losses(run, 1), default=-1) >= 12, run=run)
    hosts = (run.attempt(1) / rundir.HOSTS).read_text().split()
    lost = hosts[1]  # not the batch host: losing it would end the job itself
    report = drill(run, "--node", lost)
    assert report["culprit_right"], report
    for own in Path(os.environ["CLUSTERCTL_LOCAL_STATE"]).glob(f"jobs/*/shm/{run.path.name}/{lost}"):
        shutil.rmtree(own)  # what the lost node held (its ranks' own snapshots, a peer's replica) is gone with it
    resumed = first_step(run, 2)
    now = (run.attempt(2) / rundir.HOSTS).read_text().split()
    assert lost not in now and len(now) == len(hosts), now  # the spare took its place
    record = json.loads((run.attempt(2) / rundir.RECORD).read_text())["recovery"]
    assert record["resumed_from"]["memory"] and record["resumed_from"]["step"] == resumed - 1 >= 11, record
    assert record["resumed_from"]["from_peers"], record  # some rank's state came over the network from a peer's node
    assert max(losses(run, 1)) - (resumed - 1) <= 1, story(run)
    assert all(s.startswith("warm") for s in starts(run, 2)), starts(run, 2)  # the spare's server was up from the start
    wait_for("the run to finish", lambda: max(losses(run, 2), default=-1) == steps - 1, run=run)
    same_as_uninterrupted("local", tmp_path, run, 2, steps, spec)
    nothing_left("local", run)


def test_a_hung_or_slow_rank_is_replaced_by_the_spare_which_resumes_from_its_peers_replica(backend: str, tmp_path: Path) -> None:
    """A hang (82, on the test cluster) or a straggler (83, on the local backend) excludes the culprit's node:
    its ranks restart warm on the spare, from a peer's memory, with the losses of an uninterrupted run."""
    fault, how, code = ("hang", "3", 82) if backend == "slurm" else ("slow", "3:2", 83)  # rank 3: on hosts[1]
    steps, spec = 150, {"spares": 1, "gpus_per_node": 2, "watchdog": {"hang_timeout": "10s"},
                        "checkpoint": {"interval": 200, "memory_interval": 1}}
    done = submit(backend, tmp_path, f"warm-{fault}", steps=steps, **spec)
    run = done.run
    wait_for("step 12", lambda: max(losses(run, 1), default=-1) >= 12, run=run)
    hosts = (run.attempt(1) / rundir.HOSTS).read_text().split()
    report = drill(run, f"--{fault}", how)
    assert report["culprit_right"] and report["code"] == code, report
    resumed = first_step(run, 2)
    now = (run.attempt(2) / rundir.HOSTS).read_text().split()
    assert hosts[1] not in now and len(now) == len(hosts), now
    record = json.loads((run.attempt(2) / rundir.RECORD).read_text())["recovery"]
    assert record["resumed_from"]["memory"] and record["resumed_from"]["from_peers"], record
    assert resumed - 1 >= 12 and all(s.startswith("warm") for s in starts(run, 2)), (record, starts(run, 2))
    wait_for("the run to finish", lambda: max(losses(run, 2), default=-1) == steps - 1, run=run)
    same_as_uninterrupted(backend, tmp_path, run, 2, steps, spec)
    nothing_left(backend, run)


def test_snapshots_are_neither_written_nor_read_under_a_directory_others_may_enter(tmp_path: Path) -> None:
    """/dev/shm is every user's: a snapshot is a pickle, so a directory not this user's alone is never trusted."""
    from clusterctl.checkpoint.snapshots import Snapshots, node_dir, private_root, write_whole

    root = tmp_path / "shm"
    root.mkdir(mode=0o777)
    root.chmod(0o777)  # as if someone had made it for everyone first
    planted = node_dir(root, "run", "nodeA")
    write_whole(planted / "rank-0-of-1", 3, b"a pickle someone left")
    assert "not a directory of this user's alone (mode 777" in private_root(root)
    snaps = Snapshots(planted, rank=0, world=1, interval=1, tag="1", gpus_per_node=1)
    assert snaps.holdings() == {} and snaps.restore(None) is None  # nothing planted is ever loaded
    fresh = tmp_path / "mine"
    assert private_root(fresh) == "" and (fresh.stat().st_mode & 0o777) == 0o700
