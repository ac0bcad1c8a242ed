"""A run on a shared cluster is its owner's: another real user can read none of it; a sharing group can read it.

The set-up creates two users (`make test` runs as root): a stranger, and a
member of the sharing group. The runs root sits in a directory every user may
enter, as on a shared file system, and the job writes a checkpoint outside the
run directory (`checkpoint.dir`). What the users try is what they would type:
`ls`, `cat`, and `clusterctl status` where this Python can be run by them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BACKEND_SITES
from helpers import cli

from clusterctl.actions.submit import submit_job
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import load_job
from clusterctl.rundir import RunDir, access, history

ROOT = Path(__file__).resolve().parent.parent
STRANGER, MEMBER, GROUP = "ccstranger", "ccmember", "ccshare"
# What a rank writes: its log line, and a checkpoint shard in the spec's checkpoint.dir (outside the run).
WRITE_SHARD = 'echo "rank $RANK"; mkdir -p "$CKPT/step-1" && echo weights > "$CKPT/step-1/shard-$RANK"'


def site_packages() -> Path:
    return Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def users() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        if os.environ.get("CI"):
            pytest.fail("these tests create users: run them as root (make test does in CI)", pytrace=False)
        pytest.skip("creating the test users needs root and runuser")
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    for user, extra in ((STRANGER, []), (MEMBER, ["-G", GROUP])):
        if subprocess.run(["id", user], capture_output=True, check=False).returncode != 0:
            subprocess.run(["useradd", "-M", "-s", "/bin/sh", *extra, user], check=True)


@pytest.fixture
def shared(users: None) -> Iterator[Path]:
    """A directory every user may enter, as a shared file system's project space is."""
    base = Path(tempfile.mkdtemp(prefix="cc-shared-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def run_job(backend: str, shared: Path, **extra: object) -> RunDir:
    spec = {"name": "private", "site": BACKEND_SITES[backend], "time_limit": "10m", "nodes": 2, "gpus_per_node": 1,
            "runs_root": str(shared / "runs"), "checkpoint": {"dir": str(shared / "ckpt")},
            "env": {"CKPT": str(shared / "ckpt")}, "command": ["bash", "-c", WRITE_SHARD], **extra}
    (shared / "job.yaml").write_text(json.dumps(spec))
    old = os.umask(0o022)  # a permissive umask, the common default: the run must not depend on the user's
    try:
        run = submit_job(load_job(shared / "job.yaml"), backend).run
    finally:
        os.umask(old)
    deadline = time.monotonic() + 120
    while not any(e.get("event") == history.EVENT_NEXT for e in history.read_events(run.path / "attempts.jsonl")):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.3)
    return run


def modes(top: Path) -> dict[str, str]:
    return {str(p.relative_to(top.parent)): stat.filemode(p.stat().st_mode) for p in [top, *top.rglob("*")] if not p.is_symlink()}


def test_a_run_and_its_checkpoints_are_private_to_their_owner(backend: str, shared: Path) -> None:
    run = run_job(backend, shared)
    shard = shared / "ckpt" / "step-1" / "shard-0"
    assert shard.read_text() == "weights\n"
    batch_log = next(run.path.glob("slurm-*.out"))  # created by Slurm (or the local backend) with the submitting umask
    # Only the owner may enter or read anything, whatever the umask said.
    for top in (run.path, shared / "ckpt"):
        found = modes(top)
        assert set(found.values()) <= {"drwx------", "-rw-------", "-rwx------"}, found
    assert stat.S_IMODE(batch_log.stat().st_mode) == 0o600
    assert stat.S_IMODE((shared / "runs").stat().st_mode) == 0o700  # a runs root clusterctl made is private too
    for path in (run.path, run.path / "spec.yaml", run.path / "attempt-1" / "attempt.json", batch_log, shard, shared / "ckpt"):
        denied = as_user(STRANGER, "cat" if path.is_file() else "ls", str(path))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (path, denied)


def test_a_group_run_is_readable_by_its_group_and_no_one_else(shared: Path) -> None:
    run = run_job("local", shared, runs_mode="group", runs_group=GROUP)
    gid = int(subprocess.run(["getent", "group", GROUP], capture_output=True, text=True, check=True).stdout.split(":")[2])
    assert run.path.stat().st_gid == gid and stat.S_IMODE(run.path.stat().st_mode) == 0o2750
    attempt = run.path / "attempt-1"  # made by the job: the setgid directory gave it the group, the umask its mode
    assert attempt.stat().st_gid == gid and stat.S_IMODE(attempt.stat().st_mode) & 0o077 == 0o050
    spec = run.path / "spec.yaml"
    assert as_user(MEMBER, "cat", str(spec)).stdout == spec.read_text()
    assert as_user(MEMBER, "ls", str(attempt / "logs")).returncode == 0
    denied = as_user(MEMBER, "touch", str(run.path / "mine"))
    assert denied.returncode != 0  # read-only for the group
    # The attempt's secret is not the group's: a member who reads the run cannot speak for its aggregators.
    assert "token" not in json.loads(as_user(MEMBER, "cat", str(attempt / "attempt.json")).stdout)
    assert stat.S_IMODE((attempt / ".token").stat().st_mode) == 0o600
    assert as_user(MEMBER, "cat", str(attempt / ".token")).returncode != 0
    assert as_user(STRANGER, "cat", str(spec)).returncode != 0
    # `clusterctl status` works for the member, with a Python that user can run (Debian's, the checkout's modules).
    path = f"{ROOT}:{site_packages()}"
    probe = as_user(MEMBER, "env", f"PYTHONPATH={path}", "/usr/bin/python3", "-c", "import clusterctl.cli")
    if probe.returncode != 0:
        pytest.skip(f"the member cannot run clusterctl from this checkout ({probe.stderr.strip()[-200:]})")
    status = as_user(MEMBER, "env", f"PYTHONPATH={path}", "HOME=/tmp", "/usr/bin/python3", "-c",
                     "import sys; from clusterctl.cli import main; sys.argv[0] = 'clusterctl'; main()", "status", str(run.path), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "completed"


# What the stranger plants where the owner's job will look for a checkpoint: a generation whose DCP index is a
# pickle that, once loaded by the owner's ranks, would run the stranger's code as the owner (it leaves a file).
PLANT = """
import json, os, pickle, sys
class Run:
    def __reduce__(self):
        return (os.system, (f"touch {sys.argv[2]}",))
gen = os.path.join(sys.argv[1], "step-00000005")
os.makedirs(gen)
open(os.path.join(gen, ".metadata"), "wb").write(pickle.dumps(Run()))
size = os.path.getsize(os.path.join(gen, ".metadata"))
json.dump({"format": "clusterctl-checkpoint/1", "step": 5, "world_size": 2, "ranks": [{}, {}], "mode": "sync",
           "shards": {".metadata": {"rank": 0, "size": size, "checksum": "0"}}}, open(os.path.join(gen, "manifest.json"), "w"))
"""


def planted_job(shared: Path, **extra: object) -> Path:
    spec = {"name": "planted", "site": "local", "time_limit": "10m", "nodes": 1, "gpus_per_node": 1,
            "runs_root": str(shared / "runs"), "checkpoint": {"dir": str(shared / "ckpt")}, "command": ["true"], **extra}
    (shared / "job.yaml").write_text(json.dumps(spec))
    return shared / "job.yaml"


def test_a_checkpoint_directory_a_stranger_made_first_is_refused_at_submit(shared: Path) -> None:
    """Attack 1: in a shared scratch (sticky, every user may create), the stranger makes the owner's checkpoint.dir
    first and plants a generation whose index would run their code on every rank. Nothing is submitted."""
    shared.chmod(0o1777)
    (shared / "plant.py").write_text(PLANT)
    planted = as_user(STRANGER, "/usr/bin/python3", str(shared / "plant.py"), str(shared / "ckpt"), str(shared / "ran"))
    assert planted.returncode == 0, planted.stderr
    result = cli("submit", str(planted_job(shared)))
    assert result.exit_code == ExitCode.BAD_CONFIG, result.output
    assert "checkpoint.dir (line " in result.output and f"got '{shared / 'ckpt'}'" in result.output and f"owner {STRANGER}" in result.output
    assert "belongs to another user" in result.output
    assert not (shared / "runs").exists() and not (shared / "ran").exists()


def test_a_runs_root_or_checkpoint_directory_others_can_write_is_refused_at_submit(shared: Path) -> None:
    """Attack 2: a runs root the stranger can write lets them swap a new run directory for theirs (their wrapper,
    the owner's secrets). Refused with the path, its owner and mode, and the fix; nothing is written."""
    (shared / "runs").mkdir()
    (shared / "runs").chmod(0o777)
    result = cli("submit", str(planted_job(shared)))
    assert result.exit_code == ExitCode.BAD_CONFIG, result.output
    assert "runs_root" in result.output and "drwxrwxrwx" in result.output and "chmod go-w" in result.output
    assert list((shared / "runs").iterdir()) == []
    (shared / "runs").chmod(0o700)
    (shared / "ckpt").mkdir()
    (shared / "ckpt").chmod(0o777)
    result = cli("submit", str(planted_job(shared)))
    assert result.exit_code == ExitCode.BAD_CONFIG and "checkpoint.dir" in result.output, result.output
    assert list((shared / "runs").iterdir()) == []


def test_requeue_and_the_batch_script_read_nothing_of_a_run_that_others_can_write(tmp_path: Path) -> None:
    """The check again at requeue and when the job starts: a run directory that became writable by others since submit is not
    run (its secrets file and wrapper could be anyone's by now); 77 and a line that says why."""
    (tmp_path / "job.yaml").write_text(json.dumps({
        "name": "later", "site": "local", "time_limit": "10m", "nodes": 1, "gpus_per_node": 1,
        "runs_root": str(tmp_path / "runs"), "command": ["true"]}))
    run = submit_job(load_job(tmp_path / "job.yaml"), "local", dry_run=True).run
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # every other job of the suite passes the check
    run.path.chmod(0o777)
    requeued = cli("requeue", str(run.path))  # `requeue` submits it again: the same rule, before anything stops
    assert requeued.exit_code == ExitCode.BAD_CONFIG and "run directory" in requeued.output, requeued.output
    assert "drwxrwxrwx" in requeued.output and "chmod go-w" in requeued.output
    refused = subprocess.run(["bash", str(run.path / "job.sbatch")], capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == ExitCode.NO_PERMISSION, refused.stderr
    assert f"refusing to run: {run.path} (owner uid {os.geteuid()}, mode 777)" in refused.stderr


def test_group_sharing_needs_a_group_this_machine_knows(shared: Path) -> None:
    (shared / "job.yaml").write_text(json.dumps({"name": "g", "site": "local", "time_limit": "10m", "nodes": 1, "gpus_per_node": 1, "runs_mode": "group",
                                                 "runs_root": str(shared / "runs"), "command": ["true"]}))
    missing = cli("submit", str(shared / "job.yaml"))
    assert missing.exit_code == ExitCode.BAD_CONFIG and "runs_group" in missing.output, missing.output
    unknown = cli("submit", str(shared / "job.yaml"), "--set", "runs_group=no-such-group")
    assert unknown.exit_code == ExitCode.BAD_CONFIG and "no-such-group" in unknown.output and "getent group" in unknown.output
    assert not (shared / "runs").exists()  # refused before anything was written


def test_a_remote_runs_group_is_checked_on_the_login_node_not_on_the_laptop(tmp_path: Path) -> None:
    """`submit --remote` renders on a laptop that need not know the cluster's groups: the staged run is private
    there, and the login node's `submit-run` gives it the group, or refuses one that node does not know."""
    from clusterctl.render.runfiles import stage_run

    (tmp_path / "job.yaml").write_text(json.dumps({"name": "g", "site": "local", "time_limit": "10m", "nodes": 1,
                                                   "gpus_per_node": 1, "runs_mode": "group", "runs_group": "cc-cluster-only",
                                                   "command": ["true"]}))
    staged = stage_run(load_job(tmp_path / "job.yaml"), tmp_path / "cluster-runs" / "g-1", tmp_path / "stage", sys.executable, None)
    assert set(modes(staged.path).values()) <= {"drwx------", "-rw-------", "-rwx------"}, modes(staged.path)
    assert json.loads((staged.path / "run.json").read_text())["runs_group"] == "cc-cluster-only"
    refused = cli("submit-run", str(staged.path), "--backend", "local")
    assert refused.exit_code == ExitCode.BAD_CONFIG, refused.output
    assert "runs_group 'cc-cluster-only' is not a group on this login node" in refused.output


def test_a_sharing_group_never_gets_the_secrets_files(tmp_path: Path) -> None:
    """`submit-run` gives a shipped run its group: its secret_env values, an attempt's token and a container's rank
    environment stay the owner's."""
    import grp

    run = tmp_path / "run"
    (run / "attempt-1").mkdir(parents=True)
    for name in ("spec.yaml", ".secrets.env", ".rank.env", "attempt-1/.token", "attempt-1/attempt.json"):
        (run / name).write_text("x")
    access.Access("group", grp.getgrgid(os.getgid()).gr_name).apply(run)
    found = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run.rglob("*") if p.is_file()}
    assert found == {"spec.yaml": 0o640, ".secrets.env": 0o600, ".rank.env": 0o600, ".token": 0o600, "attempt.json": 0o640}


@pytest.mark.parametrize("dir_mode, want", [(0o700, 0o600), (0o2750, 0o640), (0o755, 0o644)])
def test_a_file_written_into_a_run_from_a_users_shell_keeps_the_runs_privacy(tmp_path: Path, dir_mode: int,
                                                                            want: int) -> None:
    """`clusterctl cancel` and `drill` write cancel.json and drill.json from the user's shell, whose umask (022)
    made them 0644 in a private run. A new file takes no bit its directory denies: a private run's are 0600, a
    group run's 0640; elsewhere the umask decides as before."""
    from clusterctl.rundir import CANCEL, write_json_atomic

    run = tmp_path / "run"
    run.mkdir()
    run.chmod(dir_mode)
    old = os.umask(0o022)
    try:
        write_json_atomic(run / CANCEL, {"by": "clusterctl cancel"})
    finally:
        os.umask(old)
    assert stat.S_IMODE((run / CANCEL).stat().st_mode) == want


STRANGER_SCRIPT = r"""
import json, socket, sys, time
host, port, nodes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
seen = {"challenged": 0, "closed": 0, "held": 0}
for node in nodes:  # a hello for every node, with a guessed secret, then beats, a rank's end, and goodbye
    conn = socket.create_connection((host, port), timeout=5)
    line = conn.recv(4096)
    seen["challenged"] += json.loads(line.split(b"\n")[0])["kind"] == "challenge"
    forged = [{"kind": "hello", "node": node, "pid": 1, "mac": "0" * 64},
              {"kind": "batch", "ranks": [[0, 1, None, "forward", 10**6, 0.0, True, False, 0, [], []]], "procs": {}},
              {"kind": "gone", "rank": 0, "pid": 1}]
    conn.sendall("".join(json.dumps(m) + "\n" for m in forged).encode())
    try:
        seen["closed"] += conn.recv(4096) == b""
    except ConnectionResetError:
        seen["closed"] += 1
    conn.close()
flood = []
for _ in range(200):  # connections held open without a word
    try:
        flood.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        pass
seen["held"] = len(flood)
time.sleep(2)
print(json.dumps(seen))
"""


def test_a_stranger_who_finds_the_ports_can_neither_stop_nor_fool_a_running_job(shared: Path) -> None:
    """The attack measured on a healthy run before these defences: a hello as a node, then hanging up, made the
    controller call that node lost (86) and move the run to another job. Now: nothing the stranger sends counts."""
    script = ROOT / "examples" / "own-script" / "train_ddp_contract.py"
    spec = {"name": "target", "site": "local", "time_limit": "10m", "nodes": 2, "gpus_per_node": 1,
            "runs_root": str(shared / "runs"), "command": ["python3", str(script)], "env": {"STEPS": "150", "BUSY_S": "0.1"}}
    (shared / "job.yaml").write_text(json.dumps(spec))
    run = submit_job(load_job(shared / "job.yaml"), "local").run
    attempt = run.path / "attempt-1"
    deadline = time.monotonic() + 120
    while not (attempt / "metrics.jsonl").is_file():
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.3)
    ports = json.loads((attempt / "controller.json").read_text())
    hosts = json.loads((attempt / "attempt.json").read_text())["hosts"]
    (shared / "stranger.py").write_text(STRANGER_SCRIPT)
    (shared / "stranger.py").chmod(0o644)
    tried = as_user(STRANGER, "/usr/bin/python3", str(shared / "stranger.py"), "127.0.0.1", str(ports["watch_port"]), ",".join(hosts))
    assert tried.returncode == 0, tried.stderr
    seen = json.loads(tried.stdout)
    assert seen["challenged"] == seen["closed"] == len(hosts) and seen["held"] > 0, seen
    # bench/programs/stranger.py: forged values in the store (a verdict, a post-check outcome naming nodes, an
    # ECC error report, malformed list entries, a rewritten registration, a stop five times), then a flood of
    # nested brackets and refused hellos at the watch port. The store has no notion of users: where the stranger's
    # Python cannot load this checkout's torch, another process writes the same.
    shutil.copy(ROOT / "bench" / "programs" / "stranger.py", shared / "attacks.py")
    master = json.loads((attempt / "attempt.json").read_text())["master_addr"]
    store = as_user(STRANGER, "env", f"PYTHONPATH={site_packages()}", "HOME=/tmp", "/usr/bin/python3",
                    str(shared / "attacks.py"), "store", master, str(ports["port"]))
    if store.returncode != 0:
        subprocess.run([sys.executable, str(shared / "attacks.py"), "store", master, str(ports["port"])], check=True,
                       capture_output=True, timeout=60)
    flood = as_user(STRANGER, "/usr/bin/python3", str(shared / "attacks.py"), "watch", master, str(ports["watch_port"]), "3")
    assert flood.returncode == 0 and json.loads(flood.stdout)["connections"] > 0, flood.stderr
    # The run's files are not the stranger's to read, so its commands cannot even find the run.
    for command in (["cancel", str(run.path)], ["drill", str(run.path), "--kill", "0"]):
        denied = as_user(STRANGER, "env", f"PYTHONPATH={ROOT}:{site_packages()}", "HOME=/tmp", "/usr/bin/python3", "-c",
                         "import sys; from clusterctl.cli import main; sys.argv[0] = 'clusterctl'; main()", *command)
        assert denied.returncode != 0 and "Traceback" not in denied.stderr and "internal error" not in denied.stderr, denied
        assert "permission denied" in (denied.stdout + denied.stderr).lower(), denied
    deadline = time.monotonic() + 180
    while not any(e.get("event") == history.EVENT_NEXT for e in history.read_events(run.path / "attempts.jsonl")):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.5)
    events = history.read_events(run.path / "attempts.jsonl")
    assert [e.get("how") for e in events if e.get("event") == history.EVENT_NEXT] == [history.NEXT_STOP]
    assert [e.get("exit") for e in events if e.get("event") == history.EVENT_END] == [0]  # trained to the end
    verdict = json.loads((attempt / "verdict.json").read_text())
    assert verdict["ok"] is True, verdict
    timeline = (attempt / "timeline.jsonl").read_text()
    assert '"node_lost"' not in timeline and "1000000" not in timeline
    assert not (run.path / "attempt-2").exists() and not (shared / "runs" / "suspects.jsonl").exists()
    log = next(run.path.glob("slurm-*.out")).read_text()
    # One line for the stranger's address, its later refusals counted in one (a flood cannot fill the log).
    assert log.count("without this attempt's secret") == 1 and "more connections (" in log, log
    assert len(log) < 64 * 1024 and "forged" not in log and "ECC" not in log


def grep_tree(top: Path, needle: bytes) -> list[str]:
    """Every file under `top` that holds `needle` (as it is, or base64-encoded as the secrets file holds it)."""
    import base64

    forms = (needle, base64.b64encode(needle))
    found = []
    for path in top.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if any(form in data for form in forms):
                found.append(str(path))
    return found


def test_a_secret_reaches_the_ranks_and_no_file_once_the_run_stopped(backend: str, shared: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import secrets as random

    value = f"sk-{random.token_hex(12)}"
    monkeypatch.setenv("MY_API_KEY", value)
    spec = {"name": "secretive", "site": BACKEND_SITES[backend], "time_limit": "10m", "nodes": 2, "gpus_per_node": 1,
            "runs_root": str(shared / "runs"), "secret_env": ["MY_API_KEY"],
            "command": ["bash", "-c", 'echo "rank $RANK key $(printf %s "$MY_API_KEY" | sha256sum | cut -c1-16)"']}
    (shared / "job.yaml").write_text(json.dumps(spec))
    run = submit_job(load_job(shared / "job.yaml"), backend).run
    deadline = time.monotonic() + 120
    while not any(e.get("how") == history.NEXT_STOP for e in history.read_events(run.path / "attempts.jsonl")):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.3)
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    logs = "".join(p.read_text() for p in (run.path / "attempt-1" / "logs").glob("node-*.log"))
    assert logs.count(f"key {digest}") == 2, logs  # both ranks had it
    assert not (run.path / ".secrets.env").exists()
    places = [run.path, shared, Path(os.environ["CLUSTERCTL_LOCAL_STATE"])]
    if backend == "slurm":
        places.append(Path(os.environ["SLURM_CONF"]).parent)  # slurmctld's state: what sbatch handed it
    assert [hit for top in places if top.is_dir() for hit in grep_tree(top, value.encode())] == []
    # Without the value in the environment the job is refused, and nothing is written.
    monkeypatch.delenv("MY_API_KEY")
    refused = cli("submit", str(shared / "job.yaml"), "--set", f"runs_root={shared / 'other'}")
    assert refused.exit_code == ExitCode.BAD_CONFIG and "secret_env" in refused.output and "MY_API_KEY" in refused.output
    assert not (shared / "other").exists()


def test_a_plain_env_entry_that_looks_like_a_secret_is_warned_about(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "w", "site": "local", "time_limit": "10m", "nodes": 1,
                                                   "gpus_per_node": 1, "env": {"WANDB_API_KEY": "abc"}, "command": ["true"]}))
    plan = cli("plan", str(tmp_path / "job.yaml"), "--json")
    assert plan.exit_code == 0, plan.output
    assert any("env.WANDB_API_KEY looks like a secret" in w and "secret_env" in w for w in json.loads(plan.stdout)["warnings"])
