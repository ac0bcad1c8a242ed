"""srun for the local backend: `python -m clusterctl.backends.local.srun [options] command ...`.

Starts the step's tasks on this machine as if on the emulated nodes (each
with the SLURM_* environment slurmstepd gives a task on that node), all in
one process group of their own, and relays their output. Behaviour pinned to
Slurm 22.05 as measured on the test cluster:

* --label prefixes every line with the task id right-aligned to the width of
  the largest id (`0: `, ` 3: ` when there are 10+ tasks); a last line without
  a newline gets one. Output is relayed line by line, so lines of different
  tasks never mix. --output/--error patterns (%N etc.) name files that are
  written here; %N is the emulated node name. In files per node or per task
  (%N, %n, %t), which Slurm's slurmstepd writes on each node, the width is
  that of the node's own task count minus one (`0: ` and `10: ` with 8 tasks
  a node), as measured.
* A task ending with a non-zero code or by a signal is reported as
  `srun: error: NODE: task N: Exited with exit code C` (or the signal's name).
  --kill-on-bad-exit then sends SIGCONT+SIGTERM to the step and SIGKILL
  KillWait (2 s) later. --wait=N: N seconds after the first task ended, the
  rest are killed with SIGKILL.
* Signals to srun: USR1, USR2, ALRM, CONT are forwarded to every process of
  the step; TERM, HUP, QUIT force termination (SIGKILL to the step); a first
  INT prints the step's status, a second within a second forwards INT, a third
  forces termination. While the job itself is killed (scancel, the time
  limit: every process gets SIGCONT+SIGTERM), srun's forced termination has
  no effect: the tasks have the job's KillWait to end on their own.
* Exit code: the largest over the tasks of the exit code, or 128+signal for a
  task killed by a signal (also when srun itself had it killed).
* A node of the step going DOWN (scontrol update NodeName=X State=DOWN):
  `srun: error: Node failure on X`; in a --no-kill job the step is then
  killed (SIGKILL, the other nodes' tasks reported as Killed, then `Force
  Terminated StepId=J.S`, exit 137), as measured when a node's slurmd died.
  Once a node has left a --no-kill job, a step that fits the nodes left runs
  (without -N, after `SLURM_JOB_NUM_NODES environment variable conflicts with
  allocated node count (2 != 1).`), one naming the lost node fails with
  `Requested node configuration is not available` (exit 1), and one that needs
  more nodes than are left stays pending until srun is signalled, as on Slurm.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import sys
import time
from pathlib import Path

from clusterctl.backends.local import KILL_WAIT_S, STATE_ENV, TIME_SCALE_ENV
from clusterctl.backends.local.batchopts import expand_pattern
from clusterctl.backends.local.formats import counts_text, timestamp
from clusterctl.backends.local.records import current_umask, down_nodes, job_dir, next_counter, read_json, user_name, write_json
from clusterctl.backends.local.relay import Sink, Stream
from clusterctl.backends.local.srunopts import (
    Layout,
    Options,
    SrunError,
    expand_counts,
    layout,
    parse,
    ranges,
    read_nodelist,
)
from clusterctl.syntax.hostlist import compress, expand

FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCONT)
FATAL = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
RESET = (
    signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD,
)
PER_NODE = re.compile(r"%\d*[nNt]")  # file names that make a file per node or per task
DRAIN_S = 1.0  # after the last task: how long to wait for output held by escaped processes
NODE_POLL_S = 0.2  # how often a step looks for DOWN nodes among its own


def say(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"srun: {message}\n".encode())


class Task:
    def __init__(self, rank: int, node_index: int, local: int, node: str) -> None:
        self.rank, self.node_index, self.local, self.node = rank, node_index, local, node
        self.pid = 0
        self.code: int | None = None  # exit code, or 128 + signal
        self.signal = 0
        self.err_sink: Sink | None = None


class Step:
    def __init__(self, opts: Options, lay: Layout, env: dict[str, str], job_id: str) -> None:
        self.opts, self.layout, self.env, self.job_id = opts, lay, env, job_id
        self.scale = float(env.get(TIME_SCALE_ENV) or 1)
        state = env.get(STATE_ENV)
        self.record = job_dir(Path(state), job_id) if state else None
        if self.record is not None and not (self.record / "steps").is_dir():
            self.record = None
        self.no_kill = False
        if self.record is not None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.no_kill = bool(read_json(self.record / "job.json")["request"].get("no_kill"))
        self.node_check: float | None = time.monotonic() if self.record is not None else None
        self.lost: set[str] = set()  # nodes of the step that went DOWN
        self.node_killed = False  # the step was killed for a lost node (--no-kill)
        self.step_id = next_counter(self.record / "steps", "next_step", 0) if self.record else 0
        self.name = f"StepId={job_id}.{self.step_id}"
        self.tasks = [Task(r, i, loc, lay.nodes[i]) for r, i, loc in lay.tasks()]
        self.width = len(str(max(lay.ntasks - 1, 0)))
        self.pgid = 0
        self.sinks: dict[str, Sink] = {}
        self.streams: dict[int, Stream] = {}
        self.running: dict[int, Task] = {}
        self.pending: list[int] = []
        self.first_end: float | None = None
        self.wait_at: float | None = None
        self.kill_at: float | None = None
        self.killing = False
        self.intr: list[float] = []

    # -- environment and output -------------------------------------------
    def base_env(self) -> dict[str, str]:
        env, lay, opts = dict(self.env), self.layout, self.opts
        counts = counts_text(lay.counts)
        env.update({
            "SLURM_NTASKS": str(lay.ntasks),
            "SLURM_NPROCS": str(lay.ntasks),
            "SLURM_NNODES": str(len(lay.nodes)),
            "SLURM_STEP_NODELIST": compress(lay.nodes),
            "SLURM_STEP_ID": str(self.step_id),
            "SLURM_STEPID": str(self.step_id),
            "SLURM_STEP_NUM_TASKS": str(lay.ntasks),
            "SLURM_STEP_NUM_NODES": str(len(lay.nodes)),
            "SLURM_STEP_TASKS_PER_NODE": counts,
            "SLURM_TASKS_PER_NODE": counts,
            "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
            "SLURM_SRUN_COMM_HOST": "127.0.0.1",
            "SLURM_UMASK": f"{current_umask():04o}",
        })
        if opts.label:
            env["SLURM_LABELIO"] = "1"
        if opts.distribution:
            env["SLURM_DISTRIBUTION"] = opts.distribution
        if opts.cpus_per_task or self.env.get("SRUN_CPUS_PER_TASK"):
            env["SLURM_CPUS_PER_TASK"] = str(lay.cpus_per_task)
        if opts.open_mode:
            env["SLURM_OPEN_MODE"] = opts.open_mode[0]
        gpus = self.env.get("SLURM_JOB_GPUS")
        if gpus:
            for key in ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "SLURM_STEP_GPUS"):
                env[key] = gpus
        env.update(opts.export)
        return env

    def sink(self, pattern: str | None, task: Task, default_fd: int) -> Sink:
        if pattern is None:
            key = f"fd:{default_fd}"
            if key not in self.sinks:
                self.sinks[key] = Sink(default_fd, owned=False)
            return self.sinks[key]
        if pattern == "none":
            path = os.devnull
        else:
            path = expand_pattern(
                pattern, job_id=int(self.job_id), name=self.env.get("SLURM_JOB_NAME", ""), user=user_name(),
                node=task.node, task=task.rank, step=str(self.step_id), node_index=task.node_index,
            )
        path = os.path.abspath(path)
        if path not in self.sinks:
            mode = self.opts.open_mode or {"a": "append"}.get(self.env.get("SLURM_OPEN_MODE", ""), "truncate")
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if mode == "append" else os.O_TRUNC)
            try:
                self.sinks[path] = Sink(os.open(path, flags, 0o644), owned=True)
            except OSError as exc:
                raise SrunError(f"cannot open output file {path}: {exc.strerror}") from None
        return self.sinks[path]

    def stepd_message(self) -> None:
        """slurmstepd's line when a step is killed, as task 0's stderr carries it."""
        node = self.layout.nodes[0]
        when = timestamp(time.time())
        text = f"slurmstepd-{node}: error: *** STEP {self.job_id}.{self.step_id} ON {node} CANCELLED AT {when} ***\n"
        task = self.tasks[0]
        if task.err_sink is not None:
            task.err_sink.write(self.label(task, self.opts.error or self.opts.output) + text.encode())

    def label(self, task: Task, pattern: str | None) -> bytes:
        """`N: ` under --label: padded to the step's widest id, or the node's in a file per node or task."""
        if not self.opts.label:
            return b""
        width = self.width
        if pattern and PER_NODE.search(pattern):
            width = len(str(self.layout.counts[task.node_index] - 1))
        return f"{task.rank:>{width}}: ".encode()

    # -- processes ---------------------------------------------------------
    def spawn(self) -> None:
        base = self.base_env()
        cpus = expand_counts(self.env["SLURM_JOB_CPUS_PER_NODE"]) if self.env.get("SLURM_JOB_CPUS_PER_NODE") else []
        node_cpus = dict(zip(expand(self.env.get("SLURM_JOB_NODELIST", "")), cpus, strict=False))
        gtids: dict[int, list[int]] = {}
        for task in self.tasks:
            gtids.setdefault(task.node_index, []).append(task.rank)
        same = (self.opts.error or self.opts.output) == self.opts.output and self.opts.output is not None
        sinks = []  # every file is opened before any task starts: a bad path starts nothing
        for task in self.tasks:
            out_sink = self.sink(self.opts.output, task, 1)
            task.err_sink = out_sink if same else self.sink(self.opts.error or self.opts.output, task, 2)
            sinks.append(out_sink)
        for task, out_sink in zip(self.tasks, sinks, strict=True):
            err_sink = task.err_sink or out_sink
            err_prefix = self.label(task, self.opts.error or self.opts.output)
            r_out, w_out = os.pipe()
            self.streams[r_out] = Stream(r_out, out_sink, self.label(task, self.opts.output))
            if same:
                r_err, w_err = r_out, w_out
            else:
                r_err, w_err = os.pipe()
                self.streams[r_err] = Stream(r_err, err_sink, err_prefix)
            env = dict(base)
            env.update({
                "SLURM_PROCID": str(task.rank),
                "SLURM_LOCALID": str(task.local),
                "SLURM_NODEID": str(task.node_index),
                "SLURMD_NODENAME": task.node,
                "SLURM_GTIDS": ",".join(map(str, gtids[task.node_index])),
                "SLURM_TOPOLOGY_ADDR": task.node,
            })
            if task.node in node_cpus:
                env["SLURM_CPUS_ON_NODE"] = str(node_cpus[task.node])
            try:
                task.pid = os.posix_spawnp(
                    self.opts.command[0], self.opts.command, env,
                    file_actions=[
                        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                        (os.POSIX_SPAWN_DUP2, w_out, 1),
                        (os.POSIX_SPAWN_DUP2, w_err, 2),
                    ],
                    setpgroup=self.pgid,
                    setsigdef=RESET,
                )
            except OSError as exc:
                message = f"slurmstepd-{task.node}: error: execve(): {self.opts.command[0]}: {exc.strerror}\n".encode()
                err_sink.write(err_prefix + message)
                task.code = 2
                self.pending.append(task.rank)
            else:
                if not self.pgid:
                    self.pgid = task.pid
                self.running[task.pid] = task
            os.close(w_out)
            if w_err != w_out:
                os.close(w_err)
        if self.record is not None and self.pgid:
            write_json(self.record / "steps" / f"{self.step_id}.json", {
                "step_id": self.step_id, "srun_pid": os.getpid(), "pgid": self.pgid,
                "nodes": self.layout.nodes, "ntasks": self.layout.ntasks,
            })

    def killpg(self, sig: int) -> None:
        if self.pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)

    def reap(self) -> None:
        done: list[Task] = [self.tasks[rank] for rank in self.pending]
        self.pending = []
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            task = self.running.pop(pid, None)
            if task is None:
                continue
            if os.WIFSIGNALED(status):
                task.signal = os.WTERMSIG(status)
                task.code = 128 + task.signal
            else:
                task.code = os.waitstatus_to_exitcode(status)
            done.append(task)
        ended: dict[tuple[str, str], list[int]] = {}
        for task in done:
            if task.signal:
                what = signal.strsignal(task.signal) or f"Signal {task.signal}"
            else:
                what = f"Exited with exit code {task.code}" if task.code else ""
            if what:
                ended.setdefault((task.node, what), []).append(task.rank)
        for (node, what), ranks in ended.items():
            if node not in self.lost:  # a lost node's slurmstepd reports nothing
                say(f"error: {node}: task{'s' if len(ranks) > 1 else ''} {ranges(ranks)}: {what}")
        for task in done:
            self.task_ended(task)

    def task_ended(self, task: Task) -> None:
        now = time.monotonic()
        if self.first_end is None:
            self.first_end = now
            if self.opts.wait:
                self.wait_at = now + self.opts.wait * self.scale
        if task.code and self.opts.kill_bad_exit and not self.killing:
            self.killing = True
            say(f"launch/slurm: _step_signal: Terminating {self.name}")
            self.stepd_message()
            self.killpg(signal.SIGCONT)
            self.killpg(signal.SIGTERM)
            self.kill_at = now + KILL_WAIT_S

    def force(self, *messages: str) -> None:
        """Kill the whole step now (srun's forced termination)."""
        for message in messages:
            say(message)
        if not self.killing:
            say(f"Job step aborted: Waiting up to {int(2 * KILL_WAIT_S)} seconds for job step to finish.")
            self.stepd_message()
        self.killing = True
        self.kill_at = None
        self.killpg(signal.SIGKILL)

    def status_lines(self) -> list[str]:
        running = [t.rank for t in self.running.values()]
        out = [f"{self.name} task{'s' if len(running) > 1 else ''} {ranges(running)}: running"] if running else []
        for clean in (True, False):
            done = [t.rank for t in self.tasks if t.code is not None and (t.code == 0) == clean]
            if done:
                word = "exited" if clean else "exited abnormally"
                out.append(f"{self.name} task{'s' if len(done) > 1 else ''} {ranges(done)}: {word}")
        return out

    def on_signal(self, sig: int) -> None:
        now = time.monotonic()
        if sig in FORWARDED:
            if sig == signal.SIGCONT:
                say("got SIGCONT")
            self.killpg(sig)
        elif sig in FATAL and self.job_ending():
            say("forcing job termination")  # Slurm's kill of the job is under way: its KillWait, not srun, decides
        elif sig in FATAL:
            self.force("forcing job termination")
        elif sig == signal.SIGINT:
            self.intr = [t for t in self.intr if now - t < 1.0] + [now]
            if len(self.intr) == 1:
                say("interrupt (one more within 1 sec to abort)")
                for line in self.status_lines():
                    say(line)
            elif len(self.intr) == 2:
                say(f"sending Ctrl-C to {self.name}")
                self.killpg(signal.SIGINT)
            else:
                self.force("forcing job termination")

    def job_ending(self) -> bool:
        """Whether the job itself is being killed (scancel, its time limit, a requeue): the supervisor says COMPLETING.

        Measured on the test cluster: the job's SIGTERM reaches srun with every
        task, srun says "forcing job termination", and yet its tasks go on
        until KillWait's SIGKILL: a rank saving on SIGTERM commits. A TERM sent
        to srun alone still kills its step at once.
        """
        if self.record is None:
            return False
        try:
            return read_json(self.record / "state.json").get("state") == "COMPLETING"
        except (OSError, ValueError):
            return False

    def check_nodes(self) -> None:
        """A node of the step DOWN: report it; in a --no-kill job kill the step (the job goes on)."""
        now = time.monotonic()
        if self.node_check is None or now < self.node_check or self.record is None:
            return
        self.node_check = now + NODE_POLL_S
        down = down_nodes(self.record.parent.parent)
        lost = [n for n in self.layout.nodes if n in down and n not in self.lost]
        if not lost:
            return
        for node in lost:
            say(f"error: Node failure on {node}")
        self.lost.update(lost)
        if self.no_kill and self.running and not self.killing:
            self.killing = self.node_killed = True
            self.kill_at = None
            self.killpg(signal.SIGKILL)

    def timers(self) -> None:
        now = time.monotonic()
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            if self.running:
                self.killpg(signal.SIGKILL)
                say(f"Force Terminated {self.name}")
        if self.wait_at is not None and now >= self.wait_at:
            self.wait_at = None
            if self.running and not self.killing:
                ago = int(round((now - (self.first_end or now)) / self.scale))
                say(f"First task exited {ago}s ago")
                for line in self.status_lines():
                    say(line)
                self.force(f"launch/slurm: _step_signal: Terminating {self.name}")

    def next_timeout(self, drain_until: float | None) -> float | None:
        times = [t for t in (self.kill_at, self.wait_at, drain_until, self.node_check) if t is not None]
        return max(0.0, min(times) - time.monotonic()) if times else None

    # -- main loop ---------------------------------------------------------
    def run(self) -> int:
        received: list[int] = []
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for sig in (*FORWARDED, *FATAL, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, lambda num, _frame: received.append(num))
        self.spawn()
        selector = selectors.DefaultSelector()
        selector.register(wake_r, selectors.EVENT_READ, None)
        for fd, stream in self.streams.items():
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, stream)
        drain_until: float | None = None
        try:
            while True:
                self.reap()
                self.timers()
                self.check_nodes()
                if not self.running and drain_until is None:
                    if self.node_killed:
                        say(f"Force Terminated {self.name}")
                    self.node_check = None
                    self.killpg(signal.SIGKILL)  # what the tasks left behind in the step
                    drain_until = time.monotonic() + DRAIN_S
                if drain_until is not None and (not self.streams or time.monotonic() >= drain_until):
                    break
                for key, _ in selector.select(self.next_timeout(drain_until)):
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 4096)
                        continue
                    self.read(selector, key.data)
                while received:
                    sig = received.pop(0)
                    if sig != signal.SIGCHLD:
                        self.on_signal(sig)
        finally:
            for stream in list(self.streams.values()):
                stream.close()
                os.close(stream.fd)
            self.streams.clear()
            for sink in self.sinks.values():
                if sink.owned:
                    os.close(sink.fd)
            if self.record is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.record / "steps" / f"{self.step_id}.json")
        return max((t.code or 0) for t in self.tasks)

    def read(self, selector: selectors.BaseSelector, stream: Stream) -> None:
        try:
            data = os.read(stream.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            stream.feed(data)
            return
        selector.unregister(stream.fd)
        stream.close()
        os.close(stream.fd)
        del self.streams[stream.fd]


def allocation(env: dict[str, str], job_id: str) -> list[str] | None:
    """The job's nodes now (fewer than SLURM_JOB_NODELIST once a node failed under --no-kill); None if unknown."""
    state = env.get(STATE_ENV)
    if not state:
        return None
    try:
        record = read_json(job_dir(Path(state), job_id) / "state.json")
    except (OSError, ValueError):
        return None
    nodes = record.get("nodes")
    return list(nodes) if nodes else None


def pending_step(job_id: str) -> int:
    """A step the allocation cannot hold now stays pending, as on Slurm, until srun is signalled."""
    got: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda num, _frame: got.append(num))
    while not got:
        time.sleep(0.2)
    say(f"Cancelled pending job step with signal {got[0]}")
    say(f"error: Unable to create step for job {job_id}: Job/step already completing or completed")
    return 1


def step_layout(opts: Options, env: dict[str, str], job_id: str) -> tuple[Layout | None, dict[str, str]]:
    """The step's layout in the allocation as it is now, and the environment to run it with (None: pending)."""
    full = expand(env.get("SLURM_JOB_NODELIST", ""))
    now = allocation(env, job_id)
    if now is None or not full or set(now) == set(full) or not set(now) < set(full):
        return layout(opts, env, job_id), env
    if opts.nodes is None:
        say(f"error: SLURM_JOB_NUM_NODES environment variable conflicts with allocated node count ({len(full)} != {len(now)}).")
    shrunk = dict(env, SLURM_JOB_NODELIST=compress(now), SLURM_NODELIST=compress(now),
                  SLURM_JOB_NUM_NODES=str(len(now)), SLURM_NNODES=str(len(now)))
    if env.get("SLURM_JOB_CPUS_PER_NODE"):
        cpus = dict(zip(full, expand_counts(env["SLURM_JOB_CPUS_PER_NODE"]), strict=False))
        shrunk["SLURM_JOB_CPUS_PER_NODE"] = counts_text([cpus.get(n, 1) for n in now])
    try:
        return layout(opts, shrunk, job_id), shrunk
    except SrunError:
        lost = [n for n in (read_nodelist(opts.nodelist) if opts.nodelist else []) if n not in now]
        if lost:
            raise SrunError(f"Unable to create step for job {job_id}: Requested node configuration is not available") from None
        layout(opts, env, job_id)  # an error here is the step's own; else it would fit the whole allocation
        return None, shrunk


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    job_id = env.get("SLURM_JOB_ID", "")
    try:
        opts = parse(args)
        if not job_id.isdigit():
            raise SrunError("SLURM_JOB_ID is not set: srun of the local backend runs inside a job (submit one with it)")
        lay, env = step_layout(opts, env, job_id)
        if lay is None:
            return pending_step(job_id)
        for warning in lay.warnings:
            say(f"Warning: {warning}")
        step = Step(opts, lay, env, job_id)
        return step.run()
    except SrunError as exc:
        say(f"error: {exc}")
        return 255 if exc.usage else 1


if __name__ == "__main__":
    sys.exit(main())
