"""One job's supervisor: `python -m clusterctl.backends.local.supervisor [--detach] JOBDIR`.

It plays slurmctld and the batch node's slurmd for one job:

1. PENDING until its dependencies have ended, its begin time (after a
   requeue) has passed and enough emulated nodes are left after ExcNodeList
   and the nodes that are DOWN.
2. RUNNING: the batch script runs through its #! interpreter, in a session
   and process group of its own, in the submit directory, with the batch
   step's SLURM_* environment, stdout and stderr to --output/--error.
3. `--signal=[B:]SIG@N` is sent N (emulated) seconds before the limit: with
   B: to the batch shell only, otherwise to every running srun step. At the
   limit every process of the job gets SIGCONT+SIGTERM, SIGKILL KillWait
   (2 s) later, and the job ends TIMEOUT. Cancel is the same kill, ending
   CANCELLED; requeue is the same kill followed by a new run of the same job
   id with SLURM_RESTART_COUNT incremented. During the kill the job shows
   JobState=COMPLETING, and after a requeue already Restarts=N+1, as on Slurm
   22.05 (measured), so a batch script's TERM trap can tell a requeue
   (Restarts > SLURM_RESTART_COUNT) from a cancel.
4. A node of the job going DOWN (scontrol update NodeName=X State=DOWN):
   with --no-kill the node leaves the job (NodeList and NumNodes shrink; srun
   kills its steps that use it) and the job runs on, unless it was the batch
   host; otherwise the job is killed as above and requeued (JobRequeue=1), or
   ends NODE_FAIL (Reason=NodeDown) with --no-requeue, as measured.
5. When the batch script exits on its own, leftover processes are killed the
   same way and the job ends COMPLETED (exit 0) or FAILED.

The final state is written only once no process of the job is left.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from clusterctl.backends.local import (
    BIN_DIR,
    CLUSTER_NAME,
    KILL_WAIT_S,
    NODES_ENV,
    PYTHON_ENV,
    REQUEUE_DELAY_ENV,
    REQUEUE_DELAY_S,
    STATE_ENV,
    TIME_SCALE_ENV,
    proctree,
)
from clusterctl.backends.local.batchopts import Request, expand_pattern
from clusterctl.backends.local.formats import counts_text, even_split, timestamp
from clusterctl.backends.local.records import FINISHED, JobRecord, down_nodes, proc_stat
from clusterctl.procfs import exited_children
from clusterctl.syntax.hostlist import compress

TICK = 0.05
SHIMS = ("srun", "scontrol", "sbatch", "squeue", "scancel")
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KILL_WORDS = {
    "CANCELLED": "",
    "TIMEOUT": " DUE TO TIME LIMIT",
    "REQUEUE": " DUE TO JOB REQUEUE",
    "NODE_FAIL": " DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS",
}


class Supervisor:
    def __init__(self, path: Path) -> None:
        self.record = JobRecord(path.parent.parent, path.name)
        self.spec = self.record.spec
        self.request = Request.from_dict(self.spec["request"])
        self.scale = float(self.spec["time_scale"])
        self.stopped: int | None = None
        self.batch_pid: int | None = None
        self.batch_status: int | None = None
        self.nodes: list[str] = []  # the run's nodes: fewer once a node failed under --no-kill

    # -- helpers -----------------------------------------------------------
    def log(self, message: str) -> None:
        print(f"{timestamp(time.time())} job {self.record.job_id}: {message}", flush=True)

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stopped = signum

    def reap(self) -> None:
        for pid, status in exited_children():
            if pid == self.batch_pid:
                self.batch_status = status

    def ops(self) -> set[str]:
        found = {request.get("op", "") for request in self.record.take_requests()}
        if self.stopped is not None:
            found.add("cancel")
        return found

    # -- pending -----------------------------------------------------------
    def pick_nodes(self, excluded: list[str]) -> list[str] | None:
        inventory = self.spec["inventory"]
        down = down_nodes(self.record.root)
        usable = [n for n in inventory if n not in excluded and n not in down]
        required = list(self.request.nodelist)
        if any(n not in usable for n in required):
            return None
        chosen = required + [n for n in usable if n not in required][: self.request.nodes - len(required)]
        if len(chosen) < self.request.nodes:
            return None
        return sorted(chosen, key=inventory.index)

    def blocker(self, state: dict) -> tuple[str | None, list[str]]:
        for kind, dep in self.request.dependency:
            other = JobRecord(self.record.root, dep)
            if not other.exists():
                continue  # purged: Slurm treats the dependency as satisfied
            dep_state = other.effective_state()["state"]
            if dep_state not in FINISHED:
                return "Dependency", []
            succeeded = dep_state == "COMPLETED"
            if (kind == "afterok" and not succeeded) or (kind == "afternotok" and succeeded):
                return "DependencyNeverSatisfied", []
        if time.time() < state.get("eligible_time", 0):
            return "BeginTime", []
        nodes = self.pick_nodes(state.get("exc_nodes", []))
        if nodes is None:
            return "ReqNodeNotAvail", []
        return None, nodes

    def wait_for_start(self) -> list[str] | None:
        while True:
            if "cancel" in self.ops():
                return None
            state = self.record.state()
            reason, nodes = self.blocker(state)
            if reason is None:
                return nodes
            if reason != state.get("reason"):
                self.record.update(reason=reason)
            time.sleep(TICK)

    # -- running -----------------------------------------------------------
    def batch_env(self, nodes: list[str], restarts: int) -> dict[str, str]:
        spec, req = self.spec, self.request
        env = dict(spec["env"])
        n = len(nodes)
        if req.ntasks:
            counts = even_split(req.ntasks, n)
        elif req.ntasks_per_node:
            counts = [req.ntasks_per_node] * n
        else:
            counts = [1] * n
        cpt = req.cpus_per_task or 1
        node_cpus = [max(c * cpt, os.cpu_count() or 1) if req.exclusive else c * cpt for c in counts]
        nodelist = compress(nodes)
        job_id = str(self.record.job_id)
        # The emulated nodes' host memory (in-memory snapshots, checkpoint/snapshots.py): the job's own, gone at its end.
        env.setdefault("CLUSTERCTL_SNAPSHOTS", str(self.record.path / "shm"))
        env.update({
            "SLURM_JOB_ID": job_id,
            "SLURM_JOBID": job_id,
            "SLURM_JOB_NAME": spec["name"],
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist,
            "SLURM_NNODES": str(n),
            "SLURM_JOB_NUM_NODES": str(n),
            "SLURM_TASKS_PER_NODE": counts_text(counts),
            "SLURM_JOB_CPUS_PER_NODE": counts_text(node_cpus),
            "SLURM_CPUS_ON_NODE": str(node_cpus[0]),
            "SLURMD_NODENAME": nodes[0],
            "SLURM_SUBMIT_DIR": spec["workdir"],
            "SLURM_SUBMIT_HOST": spec["submit_host"],
            "SLURM_JOB_PARTITION": spec["partition"],
            "SLURM_CLUSTER_NAME": CLUSTER_NAME,
            "SLURM_JOB_USER": spec["user"],
            "SLURM_JOB_UID": str(spec["uid"]),
            "SLURM_JOB_GID": str(spec["gid"]),
            "SLURM_NODEID": "0",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_GTIDS": "0",
            "ENVIRONMENT": "BATCH",
            "PATH": f"{self.shim_dir()}{os.pathsep}{env.get('PATH') or os.defpath}",
            STATE_ENV: str(self.record.root),
            PYTHON_ENV: spec["python"],
            TIME_SCALE_ENV: repr(self.scale),
            REQUEUE_DELAY_ENV: repr(float(spec.get("requeue_delay", REQUEUE_DELAY_S))),
            NODES_ENV: compress(spec["inventory"]),
        })
        if req.ntasks or req.ntasks_per_node:
            env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(sum(counts))
        if req.ntasks_per_node:
            env["SLURM_NTASKS_PER_NODE"] = str(req.ntasks_per_node)
        if req.cpus_per_task:
            env["SLURM_CPUS_PER_TASK"] = str(req.cpus_per_task)
        if req.account:
            env["SLURM_JOB_ACCOUNT"] = req.account
        if req.open_mode_given:
            env["SLURM_OPEN_MODE"] = req.open_mode[0]
        if restarts:
            env["SLURM_RESTART_COUNT"] = str(restarts)
        if req.gpus_per_node:
            gpus = ",".join(str(i) for i in range(req.gpus_per_node))
            env.update({
                "SLURM_JOB_GPUS": gpus,
                "SLURM_GPUS_ON_NODE": str(req.gpus_per_node),
                "CUDA_VISIBLE_DEVICES": gpus,
                "GPU_DEVICE_ORDINAL": gpus,
                "ROCR_VISIBLE_DEVICES": gpus,
            })
            if req.gpu_option.startswith("gpus-per-node"):
                env["SLURM_GPUS_PER_NODE"] = str(req.gpus_per_node)
        return env

    def shim_dir(self) -> Path:
        """bin/ of this package, or executable copies in the job directory where an install lost the x bits."""
        if all(os.access(BIN_DIR / tool, os.X_OK) for tool in SHIMS):
            return BIN_DIR
        target = self.record.path / "bin"
        target.mkdir(exist_ok=True)
        for tool in SHIMS:
            shutil.copyfile(BIN_DIR / tool, target / tool)
            (target / tool).chmod(0o755)
        return target

    def open_outputs(self, node: str) -> tuple[int, int]:
        spec, req = self.spec, self.request
        fields = {"job_id": self.record.job_id, "name": spec["name"], "user": spec["user"], "node": node}
        workdir = Path(spec["workdir"])
        out = workdir / expand_pattern(req.output or "slurm-%j.out", **fields)
        err = workdir / expand_pattern(req.error, **fields) if req.error else out
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if req.open_mode == "append" else os.O_TRUNC)
        out_fd = os.open(out, flags, 0o644)
        err_fd = out_fd if err == out else os.open(err, flags, 0o644)
        return out_fd, err_fd

    def argv(self) -> list[str]:
        """The script through its #! line, as the kernel would run it (works where the state dir is noexec)."""
        script = str(self.record.path / "script")
        with open(script, "rb") as fh:
            first = fh.readline().decode(errors="replace")
        words = first[2:].strip().split(None, 1)
        interpreter = words[0] if words else "/bin/sh"
        return [interpreter, *words[1:], script, *self.spec["script_args"]]

    def spawn(self, env: dict[str, str], out_fd: int, err_fd: int) -> int:
        try:
            os.chdir(self.spec["workdir"])
        except OSError as exc:
            message = f"slurmstepd: error: couldn't chdir to `{self.spec['workdir']}': {exc.strerror}: going to /tmp instead\n"
            os.write(err_fd, message.encode())
            os.chdir("/tmp")
        argv = self.argv()
        program = argv[0] if "/" in argv[0] else (shutil.which(argv[0], path=env.get("PATH")) or argv[0])
        return os.posix_spawn(
            program,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_fd, 1),
                (os.POSIX_SPAWN_DUP2, err_fd, 2),
            ],
            setsid=True,
            setsigdef=RESET_SIGNALS,
        )

    def deliver(self, num: int, batch: bool) -> None:
        """--signal: to the batch shell (B:) or to every running step."""
        self.log(f"sending SIG{signal.Signals(num).name[3:]} to the {'batch shell' if batch else 'steps'}")
        if batch:
            if self.batch_pid and self.batch_status is None:
                os.kill(self.batch_pid, num)
            return
        for step in self.record.steps():
            with contextlib.suppress(ProcessLookupError, PermissionError, KeyError, ValueError):
                os.killpg(int(step["pgid"]), num)

    def run(self, nodes: list[str]) -> str:
        """One run of the batch script; returns "requeue" or the final state."""
        req = self.request
        restarts = int(self.record.state().get("restarts", 0))
        self.batch_pid, self.batch_status = None, None
        for old in (self.record.path / "steps").glob("*"):
            old.unlink()
        env = self.batch_env(nodes, restarts)
        try:
            out_fd, err_fd = self.open_outputs(nodes[0])
        except OSError as exc:
            self.log(f"cannot open the output file: {exc}")
            self.record.update(state="FAILED", reason="JobLaunchFailure", exit_code=[1, 0], nodes=nodes, end_time=time.time())
            return "FAILED"
        try:
            self.batch_pid = self.spawn(env, out_fd, err_fd)
        except OSError as exc:
            os.write(err_fd, f"slurmstepd: error: execve(): {self.argv()[0]}: {exc.strerror}\n".encode())
            for fd in {out_fd, err_fd}:
                os.close(fd)
            self.record.update(state="FAILED", reason="JobLaunchFailure", exit_code=[1, 0], nodes=nodes, end_time=time.time())
            return "FAILED"
        started = time.time()
        self.nodes = list(nodes)
        stat = proc_stat(self.batch_pid)
        self.record.update(
            state="RUNNING", reason="None", nodes=nodes, batch_host=nodes[0], batch_pid=self.batch_pid,
            batch_start=stat[2] if stat else None, start_time=started, end_time=None,
        )
        self.log(f"run {restarts + 1} started on {compress(nodes)}: pid {self.batch_pid}, {shlex.join(self.argv())}")
        end = self.watch(req)
        requeue = end == "REQUEUE" or (end == "NODE_FAIL" and req.requeue)
        if end:
            when = timestamp(time.time())
            message = (
                f"slurmstepd-{nodes[0]}: error: *** JOB {self.record.job_id} ON {nodes[0]} "
                f"CANCELLED AT {when}{KILL_WORDS[end]} ***\n"
            )
            os.write(err_fd, message.encode())
            if requeue:  # Slurm counts the restart when it requeues, before the kill
                self.record.update(state="COMPLETING", reason="None", restarts=restarts + 1, requeueing=True)
            else:
                self.record.update(state="COMPLETING", reason="None")
        left = proctree.terminate(os.getpid(), KILL_WAIT_S, self.reap)
        if left:
            self.log(f"processes that would not die: {left}")
        self.reap()
        for fd in {out_fd, err_fd}:
            os.close(fd)
        status = self.batch_status if self.batch_status is not None else 0
        code, sig = (os.waitstatus_to_exitcode(status), 0) if os.WIFEXITED(status) else (0, os.WTERMSIG(status))
        self.log(f"run {restarts + 1} ended: {end or 'batch script exited'}, exit {code}:{sig}")
        if requeue:
            delay = float(self.spec.get("requeue_delay", REQUEUE_DELAY_S))
            self.record.update(
                state="PENDING", reason="BeginTime", requeueing=False, exit_code=[code, sig],
                eligible_time=time.time() + delay, nodes=[], end_time=time.time(),
            )
            return "requeue"
        if end:
            final, reason = end, {"TIMEOUT": "TimeLimit", "NODE_FAIL": "NodeDown"}.get(end, "None")
        elif code == 0 and sig == 0:
            final, reason = "COMPLETED", "None"
        else:
            final = "FAILED"
            reason = f"RaisedSignal:{sig}({signal.strsignal(sig)})" if sig else "NonZeroExitCode"
        self.record.update(state=final, reason=reason, exit_code=[code, sig], end_time=time.time())
        self.record.take_requests()  # posted while it was ending: nothing left to act on
        return final

    def failed_nodes(self, req: Request) -> bool:
        """Whether a node of the run went DOWN so that the job must die; with --no-kill it leaves the job instead."""
        down = down_nodes(self.record.root)
        failed = [n for n in self.nodes if n in down]
        if failed and (held := self.record.state().get("nodes")):  # a shrink (scontrol update NodeList) gave some back
            self.nodes = [n for n in self.nodes if n in held]
            failed = [n for n in self.nodes if n in down]
        if not failed:
            return False
        self.log(f"node failure: {compress(failed)} DOWN ({down[failed[0]].get('reason', '')})")
        if not req.no_kill or self.nodes[0] in failed:
            return True
        self.nodes = [n for n in self.nodes if n not in failed]
        self.record.update(nodes=self.nodes)
        self.log(f"--no-kill: {compress(failed)} removed from the job, which goes on on {compress(self.nodes)}")
        return False

    def watch(self, req: Request) -> str | None:
        """Wait for the batch script; returns why it must be killed (CANCELLED, TIMEOUT, REQUEUE, NODE_FAIL) or None."""
        start = time.monotonic()
        deadline = start + req.time_limit * self.scale if req.time_limit else None
        signal_at = None
        if req.signal and deadline is not None:
            signal_at = deadline - req.signal["lead"] * self.scale
        while True:
            self.reap()
            if self.batch_status is not None:
                return None
            ops = self.ops()
            if "cancel" in ops:
                return "CANCELLED"
            if "requeue" in ops:
                return "REQUEUE"
            if self.failed_nodes(req):
                return "NODE_FAIL"
            now = time.monotonic()
            if signal_at is not None and now >= signal_at:
                signal_at = None
                self.deliver(int(req.signal["num"]), bool(req.signal["batch"]))
            if deadline is not None and now >= deadline:
                return "TIMEOUT"
            time.sleep(TICK)

    # -- main --------------------------------------------------------------
    def main(self) -> int:
        if not proctree.become_subreaper():
            self.log("warning: cannot become a child subreaper; daemonised job processes may outlive the job")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        try:
            while True:
                nodes = self.wait_for_start()
                if nodes is None:
                    self.record.update(state="CANCELLED", reason="None", end_time=time.time())
                    self.log("cancelled while pending")
                    return 0
                if self.run(nodes) != "requeue":
                    return 0
                shutil.rmtree(self.record.path / "shm", ignore_errors=True)  # a requeued job starts with empty memory
        except Exception:
            self.log("supervisor error:\n" + traceback.format_exc())
            proctree.terminate(os.getpid(), KILL_WAIT_S, self.reap)
            self.record.update(state="NODE_FAIL", reason="SupervisorError", end_time=time.time())
            return 1
        finally:
            shutil.rmtree(self.record.path / "shm", ignore_errors=True)


def detach(path: Path) -> None:
    """Fork: the child supervises, the parent records the child's pid and returns at once."""
    pid = os.fork()
    if pid:
        stat = proc_stat(pid)
        JobRecord(path.parent.parent, path.name).update(supervisor_pid=pid, supervisor_start=stat[2] if stat else None)
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    detached = "--detach" in args
    args = [a for a in args if a != "--detach"]
    if len(args) != 1:
        print("usage: python -m clusterctl.backends.local.supervisor [--detach] JOBDIR", file=sys.stderr)
        return 2
    path = Path(args[0]).absolute()
    if detached:
        detach(path)
    else:
        stat = proc_stat(os.getpid())
        JobRecord(path.parent.parent, path.name).update(supervisor_pid=os.getpid(), supervisor_start=stat[2] if stat else None)
    return Supervisor(path).main()


if __name__ == "__main__":
    sys.exit(main())
