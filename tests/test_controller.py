"""The controller as a real process, with small stand-in ranks (TCPStore clients in threads).

torch is imported once by this test process (the clients) and once by each
controller process; the ranks' own checks are the registry's, tested apart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch_distributed = pytest.importorskip("torch.distributed")

from clusterctl.exitcodes import ExitCode  # noqa: E402
from clusterctl.rundir import rankmanifest  # noqa: E402
from clusterctl.runtime.rank import rendezvous  # noqa: E402
from clusterctl.runtime.rank.rankinfo import RankInfo  # noqa: E402
from clusterctl.runtime.wire import registration
from clusterctl.runtime.wire.greeting import registration_proof  # noqa: E402
from clusterctl.runtime.wire.sharedmarker import marker_id  # noqa: E402

TOKEN = "attempt-token"
HOSTS = ["n1", "n2"]


def make_run(tmp_path: Path, timeout_s: float = 20) -> Path:
    run_dir = tmp_path / "run"
    attempt = run_dir / "attempt-1"
    (attempt / "logs").mkdir(parents=True)
    (attempt / "hosts").write_text("\n".join(HOSTS) + "\n")
    run = {
        "world_size": 4,
        "gpus_per_node": 2,
        "parallel": {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 1},
        "rendezvous": {"timeout_s": timeout_s, "port_range": [20000, 29999]},
        "preflight": {"checks": ["shared_fs"]},
        "checkpoint": {"dir": str(run_dir / "checkpoints")},
        "node_type": {"gpu_vendor": "emulated", "binding": []},
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    return attempt


def next_attempt(run_dir: Path, n: int) -> Path:
    """attempt-N of a run that make_run created."""
    attempt = run_dir / f"attempt-{n}"
    (attempt / "logs").mkdir(parents=True)
    (attempt / "hosts").write_text("\n".join(HOSTS) + "\n")
    return attempt


class Controller:
    def __init__(self, attempt: Path, token: str = TOKEN, **env_extra: str) -> None:
        number = attempt.name.removeprefix("attempt-")
        env = dict(os.environ, CLUSTERCTL_TOKEN=token, CLUSTERCTL_ATTEMPT=number, SLURMD_NODENAME="n1", **env_extra)
        port = 20000 + os.getpid() % 9000
        self.attempt = attempt
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clusterctl.runtime.controller", "--attempt-dir", str(attempt), "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        ready = attempt / "controller.json"
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert self.proc.poll() is None, self.proc.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        self.port = json.loads(ready.read_text())["port"]

    def info(self, rank: int) -> RankInfo:
        env = {
            "CLUSTERCTL_RUN_DIR": str(self.attempt.parent),
            "CLUSTERCTL_ATTEMPT_DIR": str(self.attempt),
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port),
        }
        return RankInfo.from_env(env)

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGHUP)  # the batch script: the ranks are done
        out, _ = self.proc.communicate(timeout=30)
        return self.proc.returncode, out


def rank_record(rank: int, **changes: object) -> dict:
    """A registration as a rank writes it; `token=` one made with another attempt's secret."""
    token = str(changes.pop("token", TOKEN))
    rec = {
        "rank": rank,
        "world_size": 4,
        "host": HOSTS[rank // 2],
        "pid": 100 + rank,
        "versions": {"torch": "2.13.0", "cuda": None, "nccl": None, "hip": None},
        "preflight": [],
    }
    rec.update(changes)
    rec["proof"] = registration_proof(token, rec["rank"], rec["host"], rec["pid"])  # type: ignore[arg-type]
    return rec


def stand_in(ctl: Controller, rank: int, record: dict, results: dict, *, fail: str | None = None,
             token: str = TOKEN) -> None:
    """A rank: registers (sealed with `token`: another attempt's for a stale process), waits for the verdict."""
    store = rendezvous.connect(ctl.info(rank), 20)
    rendezvous.register(store, rank, record, token)
    results[(rank, record["pid"])] = rendezvous.await_verdict(store, 20, 4, TOKEN)
    if fail:
        rendezvous.report_error(store, rank, fail, token)


def wait_for_manifest(attempt: Path) -> dict:
    deadline = time.monotonic() + 30
    while (manifest := rankmanifest.read(attempt / "manifest.json")) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return manifest


def run_ranks(ctl: Controller, plans: list[tuple[int, dict, str | None]]) -> dict:
    results: dict = {}
    threads = [threading.Thread(target=stand_in, args=(ctl, r, rec, results), kwargs={"fail": f}) for r, rec, f in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_good_rendezvous_manifest_and_a_failing_script(tmp_path: Path) -> None:
    ctl = Controller(make_run(tmp_path))
    results = run_ranks(ctl, [(r, rank_record(r), "Traceback: boom on rank 3" if r == 3 else None) for r in range(4)])
    assert len(results) == 4 and all(v.ok for v in results.values())
    manifest = wait_for_manifest(ctl.attempt)  # written just after the verdict is published
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1, 2, 3]
    assert [r["host"] for r in manifest["ranks"]] == ["n1", "n1", "n2", "n2"]
    assert manifest["ranks"][3]["groups"]["tp"] == 1 and manifest["groups"]["dp"] == [[0, 2], [1, 3]]
    marker = tmp_path / "run" / "checkpoints" / f".clusterctl-shared-{marker_id(TOKEN)}"
    assert marker.read_text().strip() == marker_id(TOKEN) and TOKEN not in marker.read_text()
    code, out = ctl.stop()
    assert code == ExitCode.SCRIPT_FAILED, out
    verdict = json.loads((ctl.attempt / "verdict.json").read_text())
    assert verdict["culprits"] == [
        {"rank": 3, "host": "n2", "gpu": None, "reason": "script failed: Traceback: boom on rank 3",
         "evidence": "exception"}
    ]
    assert verdict["victims"] == []
    assert verdict["evidence"]["traceback"] == "Traceback: boom on rank 3"
    assert "rank 3 on n2 failed: script failed" in out


def test_a_sealed_value_opens_only_under_its_own_key_with_the_attempts_token() -> None:
    from clusterctl.store import sealed

    value = sealed.seal(TOKEN, "clusterctl/error/1", "Traceback: boom")
    assert sealed.unseal(TOKEN, "clusterctl/error/1", value) == b"Traceback: boom"
    assert sealed.unseal(TOKEN, "clusterctl/error/2", value) is None  # replayed as another rank's
    assert sealed.unseal("another-attempt", "clusterctl/error/1", value) is None
    assert sealed.unseal(TOKEN, "clusterctl/error/1", b"Traceback: forged") is None
    listed = (sealed.item(TOKEN, "k", "1") + "2," + sealed.item("x", "k", "3") + sealed.item(TOKEN, "k", "4")).encode()
    assert sealed.items(TOKEN, "k", listed) == ["1", "4"]


def test_junk_in_the_stores_lists_is_skipped_and_the_attempt_is_judged(tmp_path: Path) -> None:
    """Anyone who reaches the store can write to it: one bad `duplicates` item crashed the controller (no
    verdict, the attempt counted 84). Junk in both lists is skipped; the real failure is judged."""
    ctl = Controller(make_run(tmp_path))
    stranger = rendezvous.connect(ctl.info(0), 20)
    stranger.append(registration.DUPLICATES, "x:y,1:,-1:2,99:2,0:1,\xff,")
    stranger.append(registration.ERRORED, "nope,-3,99,,")
    results = run_ranks(ctl, [(r, rank_record(r), "Traceback: boom on rank 1" if r == 1 else None) for r in range(4)])
    assert len(results) == 4 and all(v.ok for v in results.values()), results
    code, out = ctl.stop()
    assert code == ExitCode.SCRIPT_FAILED and "Traceback (most recent call last)" not in out, out
    verdict = json.loads((ctl.attempt / "verdict.json").read_text())
    assert [(c["rank"], c["host"]) for c in verdict["culprits"]] == [(1, "n1")], verdict


def test_values_a_stranger_writes_into_the_store_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's store takes anyone's writes. A forged verdict set before the controller's, a forged post-check
    outcome naming nodes, a forged error report for rank 2 and a forged stop: the ranks wait for the controller's
    sealed verdict, the attempt ends as its ranks did (0, nobody blamed), and rank 0 is asked to stop by no one."""
    from clusterctl.runtime.rank import stoprequest

    ctl = Controller(make_run(tmp_path))
    stranger = rendezvous.connect(ctl.info(0), 20)
    stranger.set(registration.VERDICT, json.dumps({"ok": False, "code": 83, "message": "forged"}))
    stranger.set(registration.POSTCHECK, json.dumps({"ok": False, "code": 83, "message": "straggler: forged",
                                                     "culprits": [{"rank": 2, "host": "n2"}, {"rank": 0, "host": "node9"}]}))
    stranger.set(registration.error_key(2), "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    stranger.append(registration.ERRORED, "2,")
    stranger.append(registration.RETURNED, "0:1,1:1,")
    stranger.set(registration.STOP, "now")
    results = run_ranks(ctl, [(r, rank_record(r), None) for r in range(4)])
    assert len(results) == 4 and all(v.ok for v in results.values()), results
    monkeypatch.setattr(rendezvous, "CURRENT_STORE", stranger)  # rank 0's stop test reads the store it was given
    monkeypatch.setenv("CLUSTERCTL_TOKEN", TOKEN)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the test's own signal handlers stay
    assert not stoprequest.StopRequest(0).here()  # the forged stop is nobody's request
    code, out = ctl.stop()
    verdict = json.loads((ctl.attempt / "verdict.json").read_text())
    assert code == 0 and verdict["ok"] and verdict["culprits"] == [], (out, verdict)
    assert "forged" not in out and "ECC" not in out, out


def test_a_registration_rewritten_without_the_token_is_judged_forged_and_its_claims_ignored(tmp_path: Path) -> None:
    """The registration HMAC covered rank, host and pid only: a copy of a genuine record with an ECC failure in its
    preflight results made 81 "preflight failed on node2" and a suspect. The whole record is sealed now: the
    rewritten one is a record without this attempt's secret (80, ambiguous), and no preflight verdict names n2."""
    ctl = Controller(make_run(tmp_path))
    stranger = rendezvous.connect(ctl.info(0), 20)
    forged = rank_record(2, preflight=[{"name": "gpu", "ok": False, "detail": "ECC errors (forged)"}])
    stranger.set(registration.reg_key(2), registration.encode_registration(forged))  # its proof is a genuine one's
    stranger.add(registration.ARRIVED, 1)
    results = run_ranks(ctl, [(r, rank_record(r), None) for r in (0, 1, 3)])
    assert results and all(v.code == ExitCode.RENDEZVOUS_FAILED for v in results.values()), results
    message = next(iter(results.values())).message
    assert "rank 2 (pid 102 on n2) carries another attempt's token" in message and "preflight" not in message, message
    code, _ = ctl.stop()
    verdict = json.loads((ctl.attempt / "verdict.json").read_text())
    assert code == ExitCode.RENDEZVOUS_FAILED and verdict["fault"] != "node", verdict


def test_ranks_that_never_arrive_are_named_after_the_timeout(tmp_path: Path) -> None:
    attempt = make_run(tmp_path, timeout_s=3)
    (attempt / "logs" / "node-1.log").write_text("3: ModuleNotFoundError: No module named 'torch'\n")
    ctl = Controller(attempt)
    started = time.monotonic()
    results = run_ranks(ctl, [(r, rank_record(r), None) for r in range(3)])
    assert time.monotonic() - started < 15
    assert all(not v.ok and v.code == ExitCode.RENDEZVOUS_FAILED for v in results.values())
    message = next(iter(results.values())).message
    assert "rank 3 on n2 failed before registering: ModuleNotFoundError: No module named 'torch'" in message
    code, out = ctl.stop()
    assert code == ExitCode.RENDEZVOUS_FAILED and "failed before registering" in out


def test_every_registration_check_at_once(tmp_path: Path) -> None:
    """A duplicate, a stale process, a wrong world size, another torch, a wrong node: all named."""
    ctl = Controller(make_run(tmp_path))
    results: dict = {}
    probe = rendezvous.connect(ctl.info(0), 20)
    threads = []

    def claim_in_order(rank: int, record: dict, claims: int, token: str = TOKEN) -> None:
        thread = threading.Thread(target=stand_in, args=(ctl, rank, record, results), kwargs={"token": token})
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 30
        while probe.check([registration.reg_key(rank)]) + int(probe.add(registration.claim_key(rank), 0)) < claims:
            assert time.monotonic() < deadline
            time.sleep(0.05)

    # A stale process claims rank 3 first; the real rank 3 then arrives as the duplicate.
    claim_in_order(3, rank_record(3, pid=999, token="previous-attempt"), 1, "previous-attempt")
    claim_in_order(3, rank_record(3), 2)
    other_torch = {"torch": "2.12.0", "cuda": None, "nccl": None, "hip": None}
    results.update(
        run_ranks(
            ctl,
            [
                (0, rank_record(0, versions=other_torch), None),
                (1, rank_record(1, world_size=8), None),
                (2, rank_record(2, host="n1"), None),
            ],
        )
    )
    for thread in threads:
        thread.join(60)
    message = results[(1, 101)].message
    assert results[(1, 101)].code == ExitCode.RENDEZVOUS_FAILED
    for part in (
        "rank 3 registered 2 times: pid 999 on n2, pid 103 on n2",
        "rank 3 (pid 999 on n2) carries another attempt's token: a stale process",
        "rank 1 on n1 was started with WORLD_SIZE=8, the plan has 4",
        "rank 2 runs on n1, the plan puts it on n2",
        "torch versions differ: 2.13.0 on most ranks, 2.12.0 on ranks 0 (n1)",
    ):
        assert part in message, message
    code, _ = ctl.stop()
    assert code == ExitCode.RENDEZVOUS_FAILED
    assert json.loads((ctl.attempt / "verdict.json").read_text())["verdict"] == "rendezvous_failed"


def test_a_taken_port_moves_the_store_to_the_next_free_one() -> None:
    """Two jobs on one node, or a requeued attempt whose hash lands on a busy port, must not collide."""
    import socket

    from clusterctl.runtime.controller.storeport import reserve_port

    busy = socket.socket()
    busy.bind(("", 0))
    taken = busy.getsockname()[1]
    try:
        sock, port = reserve_port(taken, (taken, taken + 10))
        sock.close()
        assert port == taken + 1
        sock, port = reserve_port(taken + 10, (taken, taken + 10))  # wraps around inside the range
        sock.close()
        assert port in (taken + 10, taken + 1)
    finally:
        busy.close()


def test_srun_ending_during_the_rendezvous_judges_at_once_and_blames_who_never_came(tmp_path: Path) -> None:
    """srun ended while ranks were still arriving (the batch script's SIGHUP): judged now, not at its deadline."""
    ctl = Controller(make_run(tmp_path, timeout_s=120))
    store = rendezvous.connect(ctl.info(0), 20)
    rendezvous.register(store, 0, rank_record(0), TOKEN)
    started = time.monotonic()
    code, out = ctl.stop()
    assert time.monotonic() - started < 15, out
    assert code == ExitCode.RENDEZVOUS_FAILED
    assert "3 of 4 ranks never arrived: rank 1 on n1; ranks 2-3 on n2" in out, out
    assert [c["host"] for c in json.loads((ctl.attempt / "verdict.json").read_text())["culprits"]] == ["n1", "n2", "n2"]


@pytest.mark.parametrize("how", ["scancel", "clusterctl cancel", "time limit"])
def test_a_cancel_during_the_rendezvous_blames_no_node(tmp_path: Path, how: str) -> None:
    """scancel or clusterctl cancel (SIGTERM to every process of the job): the ranks it stops are not at fault, and
    the attempt's code is a cancel's (89), whatever the ranks exit with. Slurm's own stop (its time limit, asked of
    scontrol as the recovery step asks) is no cancel: 85, and the run goes on in a new job."""
    attempt = make_run(tmp_path, timeout_s=120)
    env: dict[str, str] = {}
    if how == "clusterctl cancel":
        (attempt.parent / "cancel.json").write_text(json.dumps({"by": "clusterctl cancel", "save": False}))
    else:  # what Slurm says of the job while it kills it
        state = "COMPLETING Reason=None" if how == "scancel" else "TIMEOUT Reason=TimeLimit"
        fake = tmp_path / "bin" / "scontrol"
        fake.parent.mkdir()
        fake.write_text(f"#!/bin/sh\necho 'JobId=5 JobState={state} Restarts=0'\n")
        fake.chmod(0o755)
        env = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "5"}
    ctl = Controller(attempt, **env)
    store = rendezvous.connect(ctl.info(0), 20)
    rendezvous.register(store, 0, rank_record(0), TOKEN)
    told: dict = {}
    waiting = threading.Thread(target=lambda: told.update(rendezvous.await_verdict(store, 30, 4, TOKEN).as_dict()))
    waiting.start()
    time.sleep(0.5)
    ctl.proc.send_signal(signal.SIGTERM)
    out, _ = ctl.proc.communicate(timeout=30)
    waiting.join(30)
    verdict = json.loads((ctl.attempt / "verdict.json").read_text())
    assert verdict["culprits"] == [] and not verdict["ok"], verdict
    assert "1 of 4 ranks had arrived" in verdict["message"] and "no node is blamed" in verdict["message"], out
    assert told["culprits"] == [] and not told["ok"], told  # a waiting rank is released, and told why
    if how == "time limit":
        assert (ctl.proc.returncode, verdict["code"], told["code"]) == (85, 85, 85), out
        assert verdict["message"].startswith("Slurm stopped the job at its time limit before the rendezvous"), verdict
    else:
        assert (ctl.proc.returncode, verdict["code"], verdict["verdict"], told["code"]) == (89, 89, "cancelled", 89), out
        assert verdict["message"].startswith(f"cancelled by {how}: the job was stopped from outside before the rendezvous")


def test_an_attempts_marker_lives_as_long_as_its_controller_and_stale_ones_go(tmp_path: Path) -> None:
    """One marker per live attempt in the checkpoint directory, none once the job ended.

    Attempt 1 ends normally; attempt 2's controller is killed with the job
    (SIGKILL), leaving its marker; attempt 3 removes that one when it writes
    its own. Another run's marker in the same directory is never touched.
    """
    run_dir = make_run(tmp_path, timeout_s=60).parent
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir()
    (ckpt / ".clusterctl-shared-another-run").write_text("another-run")

    def markers() -> list[str]:
        return sorted(p.name for p in ckpt.iterdir() if p.name.startswith(".clusterctl-shared-"))

    first = Controller(run_dir / "attempt-1", token="tok-1")
    assert markers() == sorted([".clusterctl-shared-another-run", ".clusterctl-shared-" + marker_id("tok-1")])
    code, out = first.stop()
    assert code == ExitCode.RENDEZVOUS_FAILED, out
    assert markers() == [".clusterctl-shared-another-run"]

    second = Controller(next_attempt(run_dir, 2), token="tok-2")
    second.proc.kill()
    second.proc.communicate(timeout=30)
    assert markers() == sorted([".clusterctl-shared-another-run", ".clusterctl-shared-" + marker_id("tok-2")])

    third = Controller(next_attempt(run_dir, 3), token="tok-3")
    assert markers() == sorted([".clusterctl-shared-another-run", ".clusterctl-shared-" + marker_id("tok-3")])
    code, out = third.stop()
    assert code == ExitCode.RENDEZVOUS_FAILED, out
    assert markers() == [".clusterctl-shared-another-run"]


def test_the_store_port_listens_before_the_store_starts() -> None:
    """Ranks that start before the controller has imported torch queue in the backlog, not retry; on the rendezvous
    address only, when the host has it."""
    import socket

    from clusterctl.runtime.controller.storeport import reserve_port

    with socket.socket() as probe:
        probe.bind(("", 0))
        first = probe.getsockname()[1]
    listener, port = reserve_port(first, (first, first + 10))
    try:
        assert listener.family == socket.AF_INET  # IPv4 peers are found in /etc/hosts; mapped IPv6 ones go to DNS
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        listener.close()
    # Only the rendezvous address: another address of this host (127.0.0.2 is loopback too) is refused.
    listener, port = reserve_port(first, (first, first + 10), address="127.0.0.1")
    try:
        assert listener.getsockname()[0] == "127.0.0.1"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", port), timeout=5)
    finally:
        listener.close()
    # An address this host does not have (192.0.2.1 is for documentation): every address, as before.
    listener, port = reserve_port(first, (first, first + 10), address="192.0.2.1")
    try:
        assert listener.getsockname()[0] == "0.0.0.0"
    finally:
        listener.close()
    if socket.has_ipv6:  # an IPv6 site: dual stack, so IPv4 clients still reach it
        try:
            listener, port = reserve_port(first, (first, first + 10), "ipv6")
        except RuntimeError:
            pytest.skip("no IPv6 on this host")
        try:
            assert listener.family == socket.AF_INET6
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        finally:
            listener.close()


def test_the_process_group_reuses_the_registered_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """One connection per rank: the script's env:// init gets the client the rank registered with."""
    import importlib
    from datetime import timedelta

    torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module; the package exports a function of that name

    monkeypatch.setitem(torch_rendezvous._rendezvous_handlers, "env", torch_rendezvous._rendezvous_handlers["env"])
    master = torch_distributed.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=timedelta(seconds=20))
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master.port), "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "")
    client = torch_distributed.TCPStore("127.0.0.1", master.port, 1, False, timeout=timedelta(seconds=20))

    rendezvous.share_with_process_group(client, 0, 1)

    store, rank, world = next(torch_rendezvous.rendezvous("env://", 0, 1))
    assert store is client and (rank, world) == (0, 1)
    again, _, _ = next(torch_rendezvous.rendezvous("env://", 0, 1))
    assert again is not client  # a second group connects on its own, to the same store
    again.set("from-second", "1")
    assert client.get("from-second") == b"1"
    rendezvous.share_with_process_group(client, 0, 1)
    torch_distributed.init_process_group("gloo")  # env://, as a rank's script calls it
    try:
        torch_distributed.barrier()
    finally:
        torch_distributed.destroy_process_group()
