"""The rank's process: `python -m clusterctl.launch -- <command>`.

The wrapper execs this once per rank, so the rank's Python process is the
only one per GPU. It checks the node (preflight), imports torch once,
registers with the controller and waits for its verdict, then runs the
user's command: a Python command (`python -m mod ...`, `python script.py
...`) in this process, where its `init_process_group()` (env://) joins the
controller's store; anything else replaces this process.

Outside a clusterctl attempt (no CLUSTERCTL_ATTEMPT_DIR), it only runs the
command, so a launch line can be tried by hand.
"""

from __future__ import annotations

import os
import platform
import runpy
import sys
import time
import traceback
from typing import Any

from clusterctl import envnames
from clusterctl.exitcodes import ExitCode
from clusterctl.runtime.rank import heartbeat, procexit, stepwatch
from clusterctl.runtime.wire import greeting, stacks
from clusterctl.runtime.wire.registration import POST_RENDEZVOUS
from clusterctl.runtime.wire.sharedmarker import marker_path
from clusterctl.syntax.cpulist import format_cpulist, parse_cpulist

PYTHONS = ("python", "python3", os.path.basename(sys.executable))


def run_command(argv: list[str]) -> None:
    """Run argv in this process when it is Python, else exec it.

    The script's namespace is kept until the process ends (runtime/rank/procexit.py):
    freeing it here would destroy the script's torch objects while the
    interpreter runs, which deadlocks a DDP model's gloo group."""
    if not argv:
        raise SystemExit("clusterctl.launch: no command given (usage: python -m clusterctl.launch -- CMD ...)")
    if os.path.basename(argv[0]) in PYTHONS and len(argv) > 1:
        args = argv[1:]
        if args[0] == "-m" and len(args) > 1:
            sys.argv = [args[1], *args[2:]]
            procexit.keep(runpy.run_module(args[1], run_name="__main__", alter_sys=True))
            return
        if args[0] == "-c" and len(args) > 1:  # the same interpreter as a script gets, and watched the same way
            sys.argv = ["-c", *args[2:]]
            namespace = procexit.keep({"__name__": "__main__", "__builtins__": __builtins__})
            exec(compile(args[1], "<string>", "exec"), namespace)  # noqa: S102
            return
        if not args[0].startswith("-"):
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            procexit.keep(runpy.run_path(args[0], run_name="__main__"))
            return
    os.execvp(argv[0], argv)


def bind_cpus_if_unbound() -> None:
    """The wrapper binds with numactl or taskset; without either, bind here."""
    if os.environ.get(envnames.BIND_TOOL) == "none" and os.environ.get(envnames.CPUS):
        try:
            os.sched_setaffinity(0, parse_cpulist(os.environ[envnames.CPUS]))
        except (OSError, ValueError) as exc:
            print(f"clusterctl.launch: cannot bind to CPUs {os.environ[envnames.CPUS]}: {exc}", file=sys.stderr)


def versions() -> dict[str, Any]:
    import torch

    nccl = None
    try:
        if torch.cuda.is_available():
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a CPU build has no NCCL
        nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "nccl": nccl,
    }


def preflight(info: Any) -> list[dict[str, Any]]:
    from clusterctl.runtime.rank.preflight import PreflightContext, run_checks

    run = info.run
    checks = [c for c in run.preflight.checks if c not in POST_RENDEZVOUS]
    row = run.node_type.row(info.gpu)
    checkpoint_dir = str(run.checkpoint_dir(info.run_dir))
    ctx = PreflightContext(
        rank=info.rank,
        local_rank=info.local_rank,
        host=info.host,
        gpu=info.gpu,
        gpu_vendor=run.node_type.gpu_vendor,
        expected_cpus=parse_cpulist(info.cpus) if info.cpus else frozenset(),
        nics=info.nics,
        nic_kinds=tuple(k for k in row.get("nic_kinds", "").split(",") if k),
        dirs=(os.environ.get("TMPDIR", "/tmp"), checkpoint_dir, str(info.attempt_dir)),
        shared_marker=marker_path(checkpoint_dir, info.token) if info.token else None,
        shared_token=info.token or None,
        imex=bool(run.segment_nodes) and run.node_type.gpu_vendor == "nvidia",
        imex_dir=os.environ.get(envnames.IMEX_CHANNELS) or PreflightContext.imex_dir,
    )
    return [
        {"name": r.name, "ok": r.ok, "skipped": r.skipped, "detail": r.detail, "data": r.data}
        for r in run_checks(checks, ctx)
    ]


def managed(argv: list[str]) -> int:
    """Preflight, register, wait for the verdict, run the command; the rank's exit code."""
    from clusterctl.runtime.rank import rendezvous
    from clusterctl.runtime.rank.rankinfo import RankInfo

    started = time.time()
    info = RankInfo.from_env()
    bind_cpus_if_unbound()
    checks = preflight(info)
    checked = time.time()
    found = versions()  # imports torch: the one import of this process
    record = _registration(info, started, checks, checked, found)
    timeout_s = float(info.run.rendezvous.timeout_s)
    joined = _join(info, record, timeout_s)
    if isinstance(joined, int):
        return joined
    store, verdict = joined
    if not verdict.ok:
        if info.rank == 0:
            print(f"clusterctl: {verdict.message}", file=sys.stderr)
        return int(verdict.code)
    if (failed := _post_checks(info, store, timeout_s)) is not None:
        return failed
    rendezvous.share_with_process_group(store, info.rank, info.world_size)
    rendezvous.CURRENT_STORE = store
    watched(info, cuda=found["nccl"] is not None)
    return _run_reported(argv, info, store)


def _join(info: Any, record: dict[str, Any], timeout_s: float) -> tuple[Any, Any] | int:
    """Register and wait for the verdict: (the rank's store client, the verdict), or the exit code when the store
    cannot be reached. A rank of a node of several registers through the node's first rank (nodegather.py)."""
    from clusterctl.runtime.rank import nodegather, rendezvous
    from clusterctl.runtime.wire import registration

    path = nodegather.folder(info)
    payload = registration.sealed_registration(info.token, info.rank, 1, record)
    outcome = None
    if path is not None and info.local_rank:
        wait_s = timeout_s + registration.verdict_margin_s(info.world_size)
        outcome, verdict = nodegather.follow(path, info.rank, payload, lambda raw: rendezvous.opened_verdict(
            raw, info.token), time.monotonic() + wait_s)
        store: Any = rendezvous.LazyStore(info, timeout_s)
        if outcome == nodegather.TOLD:
            return store, verdict
    try:
        store = rendezvous.connect(info, timeout_s)
    except Exception as exc:  # noqa: BLE001
        print(
            f"clusterctl.launch: rank {info.rank} on {info.host} cannot reach the rendezvous store at"
            f" {info.master_addr}:{info.master_port}: {exc}",
            file=sys.stderr,
        )
        return int(ExitCode.RENDEZVOUS_FAILED)
    if outcome == nodegather.STORE:  # the leader registered this rank, and died before handing the verdict on
        return store, rendezvous.await_verdict(store, timeout_s, info.world_size, info.token)
    registered: list[int] = []
    if path is not None and not info.local_rank:
        payloads = nodegather.gather(path, info.rank, info.gpus_per_node, info.world_size, payload)
        registered = rendezvous.register_node(store, info.node_slot, payloads, info.token, info.attempt_dir)
        nodegather.announce(path, registered)
    if info.rank not in registered:
        rendezvous.register(store, info.rank, record, info.token, listed=info.gpus_per_node > 1)
    verdict, raw = rendezvous.await_sealed_verdict(store, timeout_s, info.world_size, info.token)
    if registered and raw is not None:
        nodegather.relay(path, raw)
    return store, verdict


def _registration(info: Any, started: float, checks: dict[str, Any], checked: float, found: dict[str, Any]) -> dict[str, Any]:
    """The record this rank registers: who and where it is, its binding, versions, preflight and timings (and, once
    a node, the node's environment)."""
    from clusterctl.runtime.rank.preflight.gpu import fabric_id

    record = {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "host": info.host,
        "pid": os.getpid(),
        "cwd": os.getcwd(),  # where the user's command runs: the submit directory, in every attempt and continuation
        "proof": greeting.registration_proof(info.token, info.rank, info.host, os.getpid()),  # never the token itself
        "attempt": info.attempt,
        "gpu": info.gpu,
        "cpus": format_cpulist(os.sched_getaffinity(0)),
        "numa": info.numa,
        "nics": list(info.nics),
        "versions": found,
        "start": os.environ.get(envnames.START, "cold"),  # warm (forked from the node's server) or cold, and why
        "fabric": fabric_id(checks),  # the GPU's NVLink fabric (cluster/clique): the controller compares NVLink-bound groups
        "preflight": checks,
        "timings": {"started": started, "preflight_done": checked, "torch_imported": time.time()},
    }
    if info.local_rank == 0:  # the node's environment, once per node: manifest.json stays small at any scale
        from clusterctl.runtime.rank.rankinfo import driver_version, effective_env, recorded_env

        record["env"] = recorded_env(secret=info.run.secret_env)
        record["driver"] = driver_version()
        if info.rank == 0 and info.run.container:  # inside an image: what rank 0 really ran with
            record["container_env"] = effective_env(secret=info.run.secret_env)
    return record


def _post_checks(info: Any, store: Any, timeout_s: float) -> int | None:
    """The opt-in checks after the rendezvous (comm, compute): the failing code, or None when none failed."""
    post = [c for c in info.run.preflight.checks if c in POST_RENDEZVOUS]
    if post:
        from clusterctl.runtime.rank import rendezvous
        from clusterctl.runtime.rank.postchecks import run_post_checks

        failure = run_post_checks(post, info, rendezvous.client(store), timeout_s)  # torch's groups take torch's client
        if failure is not None:
            if info.rank == 0:
                print(f"clusterctl: {failure.message}", file=sys.stderr)
            return int(failure.code)
        if info.rank == 0:
            print(f"clusterctl: {' and '.join(post)} check passed (attempt-{info.attempt}/checks.json)", flush=True)
    return None


def _run_reported(argv: list[str], info: Any, store: Any) -> int:
    """Run the user's command and tell the controller how it ended: returned, stopped on request (85), or failed
    with its traceback (after the peers' reports, so that the blame sees them all)."""
    from clusterctl.runtime.rank import rendezvous

    try:
        run_command(argv)
    except SystemExit as exc:
        if exc.code in (None, 0):
            rendezvous.report_returned(store, info.rank, 0, info.token)
            return 0
        if exc.code == ExitCode.PRE_TIMEOUT:
            rendezvous.report_returned(store, info.rank, int(ExitCode.PRE_TIMEOUT), info.token)
            return int(ExitCode.PRE_TIMEOUT)  # saved and committed on request: not a failure
        rendezvous.report_error(store, info.rank, f"SystemExit({exc.code!r})", info.token)
        rendezvous.await_peer_reports(store, info.world_size, info.token)
        raise
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        rendezvous.report_error(store, info.rank, text, info.token)
        rendezvous.await_peer_reports(store, info.world_size, info.token)
        return 1
    else:
        rendezvous.report_returned(store, info.rank, 0, info.token)
    finally:
        watch = stepwatch.current()
        if watch is not None:
            watch.close()
        heartbeat.shared(info.rank, info.attempt).close()
    return 0


def watched(info: Any, *, cuda: bool) -> None:
    """Liveness beats to the node's aggregator, stacks on request, NCCL's flight recorder on GPUs."""
    stacks.arm(info.attempt_dir, info.rank)
    if cuda:
        stacks.arm_flight_recorder(info.attempt_dir)
    heartbeat.shared(info.rank, info.attempt)
    procexit.keep_destroyed_groups()
    stepwatch.install(info.rank, info.world_size, info.attempt, str(info.attempt_dir), info.run.watchdog.steps)


def main(argv: list[str] | None = None) -> None:
    """Run the command (managed inside an attempt) and end the process as runtime/rank/procexit.py does: never returns."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not os.environ.get(envnames.ATTEMPT_DIR):
        procexit.end_like(lambda: run_command(args))
    procexit.end_like(lambda: managed(args))


if __name__ == "__main__":
    main()
