"""Automatic recovery: from a fault verdict (or a pre-timeout signal) to the first resumed step.

4 ranks (2 nodes x 2 emulated GPUs) of the reference trainer, `--step-compute-s 1`,
`checkpoint.interval: 10`, `spares: 1`. Faults come from outside with
`clusterctl drill`; the bench polls the run directory every 0.1 s and takes
the wall time at which each milestone first appears (the attempt directory,
controller.json, manifest.json = every rank registered, the trainer's
"training ... from step N" line, the first metrics.jsonl record).

* local (always): `drill --kill 2` once step KILL_AT (15; 12 with --quick) is
  done, past the checkpoint of step 9. `resume_s` = verdict.json's `time` to
  the first metrics.jsonl record of the next attempt (restarted inside the
  allocation); `steps_lost` = the last step reached before the kill minus
  (the first resumed step - 1), i.e. steps computed twice.
* slurm-lab (when tests/slurmlab/lab.sh status says the lab is up; not with
  --quick): the same kill drill restarted inside the allocation, and again
  with `restart: {in_allocation: false}` (a continuation job):
  `inalloc_vs_newjob_ratio` = the two resume times. Then `drill
  --pre-timeout` (USR2 to the batch shell, `scancel --signal=USR2 --batch`,
  as `--signal=B:USR2@lead` would), timed from the injection to the first
  resumed step in the continuation job, against a submitit
  `helpers.Checkpointable` running the same trainer workload (the same
  model, data, sampler, optimizer and busy compute, from clusterctl.trainer.loop)
  and saving in `checkpoint()`: submitit's own pre-timeout signal
  (`--signal=USR2@90`, no B:, so it goes to the job's steps) is sent with
  `scancel --signal=USR2` and submitit requeues the job itself.
  `ratio_vs_submitit` = ours / submitit's.

* warm, cold (--quick runs these two on the local backend only): the kill
  drill with warm processes and in-memory snapshots (`restart.warm: true`,
  `checkpoint.memory_interval: 1`) and without them, on the local backend and
  (without --quick) on slurm-lab: `warm_resume_s`, `warm_steps_lost`,
  `cold_resume_s`, `cold_steps_lost`, `warm_vs_cold` (warm / cold resume),
  `*_kill_to_step_s`, and `goodput_16k` (bench/README.md states the model);
  slurm-lab's keys start with `lab_`.
* preempt (--quick: on the local backend only): the job's SIGTERM (scancel,
  as a preemption or the time limit sends it) after step 12, with warm ranks
  and without, a ~10M-parameter model (4 ranks save ~0.5 GB) on 0.05 s
  steps: `preempt_saved` = {warm, cold, lab_warm, lab_cold: {last_step
  before the signal, committed step after it (null: nothing saved),
  signal_to_commit_s}}.

Targets: resume_s <= 10, steps_lost <= checkpoint_interval,
inalloc_vs_newjob_ratio <= 0.5, ratio_vs_submitit <= 1.0; warm_resume_s <= 3
on slurm-lab, warm_steps_lost <= 1, warm_vs_cold <= 0.3; preempt_saved: warm commits what cold commits.

Each part runs on its own: one that fails (the recovery misbehaving: no
restart, the wrong kind of restart, the wrong step resumed) prints the run
directory, attempts.jsonl and the batch log's tail, leaves its figures null,
records why under "errors", keeps the scratch directory, and the next part
runs. Every job submitted is cancelled at the end.

    python bench/recovery.py [--quick] [--parts local,inalloc,newjob,pretimeout,submitit,warm,cold,preempt] [--keep]

Last line: {"resume_s", "steps_lost", "checkpoint_interval",
"inalloc_vs_newjob_ratio", "ratio_vs_submitit", ...} (null when not measured).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from clusterctl.rundir import MANIFEST, rankmanifest
from clusterctl.rundir import read_json as load_json

REPO = Path(__file__).resolve().parents[1]
CLUSTERCTL = [str(Path(sys.executable).with_name("clusterctl"))]
LAB = REPO / "tests" / "slurmlab" / "lab.sh"
INTERVAL = 10  # checkpoint.interval, steps
POLL_S = 0.1
KILL_RANK = 2  # a rank of the second node
MODEL = {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "ffn": 64}
SEQ_LEN = 16
STEP_COMPUTE_S = 1.0
TOTAL_STEPS = 100000  # never reached: every job is cancelled once measured

Show = Callable[[str], None]


# --- run directories ---------------------------------------------------------------
def records(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def events(run: Path) -> list[dict[str, Any]]:
    return records(run / "attempts.jsonl")


def last_step(attempt: Path) -> int:
    steps = [r["step"] for r in records(attempt / "metrics.jsonl") if isinstance(r.get("step"), int)]
    return max(steps) if steps else -1


def grep_logs(attempt: Path, pattern: re.Pattern[str]) -> re.Match[str] | None:
    for log in sorted(glob.glob(str(attempt / "logs" / "node-*.log"))):
        with contextlib.suppress(OSError):
            found = pattern.search(Path(log).read_text(errors="replace"))
            if found:
                return found
    return None


TRAINING = re.compile(r"training \S+ \(\S+\) on \d+ ranks from step (\d+)")
STOPPED = re.compile(r"stop requested; step (\d+) committed")


class Watcher(threading.Thread):
    """Polls attempt N of a run every 0.1 s; the wall time each milestone was first seen."""

    def __init__(self, run: Path, attempt: int, previous: Path | None = None) -> None:
        super().__init__(daemon=True)
        self.dir = run / f"attempt-{attempt}"
        self.previous = previous
        self.seen: dict[str, float] = {}
        self.first: dict[str, Any] | None = None
        self.resumed_from: int | None = None
        self.done = threading.Event()
        self.halt = threading.Event()

    def mark(self, name: str, now: float) -> None:
        self.seen.setdefault(name, now)

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.time()
            if self.previous is not None and "stop_committed" not in self.seen and grep_logs(self.previous, STOPPED):
                self.mark("stop_committed", now)
            if self.dir.is_dir():
                self.mark("attempt_dir", now)
                with contextlib.suppress(OSError):
                    if (self.dir / "controller.json").stat().st_size > 0:
                        self.mark("controller", now)
                if (self.dir / "manifest.json").exists():
                    self.mark("registered", now)
                if "training" not in self.seen:
                    found = grep_logs(self.dir, TRAINING)
                    if found:
                        self.mark("training", now)
                        self.resumed_from = int(found.group(1))
                got = records(self.dir / "metrics.jsonl")
                if got:
                    self.mark("first_step", now)
                    self.first = got[0]
                    self.done.set()
                    return
            time.sleep(POLL_S)

    def wait(self, timeout: float) -> bool:
        ok = self.done.wait(timeout)
        self.halt.set()
        return ok


def rank_timings(attempt: Path) -> dict[str, float]:
    """From the attempt's manifest: the first rank's start and the last rank's torch import."""
    ranks = list(rankmanifest.iter_ranks(attempt / MANIFEST))
    timings = [r.get("timings") or {} for r in ranks if isinstance(r, dict)]
    out: dict[str, float] = {}
    started = [t["started"] for t in timings if isinstance(t.get("started"), (int, float))]
    imported = [t["torch_imported"] for t in timings if isinstance(t.get("torch_imported"), (int, float))]
    if started:
        out["ranks_started"] = min(started)
    if imported:
        out["torch_imported"] = max(imported)
    return out


def breakdown(seen: dict[str, float], origin: float) -> str:
    order = ["stop_committed", "attempt_dir", "controller", "ranks_started", "torch_imported", "registered", "training",
             "first_step"]
    return ", ".join(f"{k} +{seen[k] - origin:.1f}" for k in order if k in seen)


# --- jobs --------------------------------------------------------------------------
def spec(name: str, site: str, runs: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "site": site,
        "time_limit": "30m" if site != "local" else "2h",
        "nodes": 2,
        "gpus_per_node": 2,
        "runs_root": str(runs),
        "checkpoint": {"interval": INTERVAL, "keep": 2, "memory_interval": 0},  # the durable path; WARM: from memory
        "model": MODEL,
        "seq_len": SEQ_LEN,
        "command": ["python3", "-m", "clusterctl.trainer", "--steps", str(TOTAL_STEPS), "--eval-interval", "0",
                    "--step-compute-s", f"{STEP_COMPUTE_S:g}"],
        **extra,
    }


class Jobs:
    """Every run and submitit job this bench started, to cancel in the end."""

    def __init__(self) -> None:
        self.runs: list[tuple[Path, str]] = []  # run directory, backend
        self.submitit: list[str] = []

    def ids(self, run: Path) -> list[str]:
        found = [str((load_json(run / "state.json") or {}).get("job_id") or "")]
        for e in events(run):
            found += [str(e.get("job_id") or ""), str(e.get("next_job") or "")]
        for info in run.glob("attempt-*/attempt.json"):
            found.append(str((load_json(info) or {}).get("job_id") or ""))
        return [j for j in dict.fromkeys(found) if j]

    def cancel_run(self, run: Path, backend: str) -> None:
        from clusterctl.backends import get_backend

        be = get_backend(backend)
        done: set[str] = set()
        for _ in range(5):  # a continuation may be submitted while we cancel: look again
            fresh = [j for j in self.ids(run) if j not in done]
            if not fresh:
                break
            for job in fresh:
                with contextlib.suppress(Exception):
                    be.cancel(job)
                done.add(job)
            time.sleep(1.0)

    def cancel_all(self) -> None:
        for run, backend in self.runs:
            self.cancel_run(run, backend)
        for job in self.submitit:
            subprocess.run(["scancel", job], capture_output=True, check=False)


def submit(jobs: Jobs, scratch: Path, name: str, site: str, backend: str, **extra: Any) -> Path:
    from clusterctl.actions.submit import submit_job
    from clusterctl.plan.job import load_job

    path = scratch / f"{name}.yaml"
    path.write_text(json.dumps(spec(name, site, scratch / "runs", **extra)))
    done = submit_job(load_job(path), backend)
    jobs.runs.append((done.run.path, backend))
    return done.run.path


def wait_steps(attempt: Path, step: int, timeout: float, show: Show) -> None:
    start = time.monotonic()
    shown = 0.0
    while last_step(attempt) < step:
        verdict = load_json(attempt / "verdict.json")
        if verdict and not verdict.get("ok", True):
            raise RuntimeError(f"{attempt}: verdict before the drill: {verdict.get('message')}")
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            raise RuntimeError(f"{attempt}: step {step} not reached within {timeout:g} s (at {last_step(attempt)})")
        if elapsed - shown >= 15:
            show(f"  ... {elapsed:.0f} s, at step {last_step(attempt)}")
            shown = elapsed
        time.sleep(0.2)


def drill(run: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLUSTERCTL, "drill", str(run), *args, "--timeout", "300", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def drill_report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=400)
    for line in reversed(out.strip().splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    raise RuntimeError(f"drill printed no report (exit {proc.returncode}): {err.strip()[-500:]}")


class Misbehaved(RuntimeError):
    """The recovery did not do what it should: the run is kept and described."""


def describe(run: Path) -> str:
    lines = [f"run directory: {run}", "attempts.jsonl:"]
    lines += ["  " + json.dumps(e) for e in events(run)]
    for out in sorted(run.glob("slurm-*.out")):
        tail = out.read_text(errors="replace").splitlines()[-25:]
        lines += [f"{out.name} (tail):"] + ["  " + t for t in tail]
    return "\n".join(lines)


def settle(run: Path, attempt: int, timeout: float = 15.0) -> None:
    """Give the batch script time to record how attempt `attempt` ended and what comes next."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.get("event") == "next" and e.get("attempt") == attempt for e in events(run)):
            return
        time.sleep(0.5)


def expect_next(run: Path, attempt: int, how: str) -> dict[str, Any]:
    nexts = [e for e in events(run) if e.get("event") == "next" and e.get("attempt") == attempt]
    if not nexts or nexts[-1].get("how") != how:
        raise Misbehaved(f"attempt {attempt} was followed by {nexts[-1].get('how') if nexts else 'nothing'}, expected {how}")
    return nexts[-1]


# --- measurements --------------------------------------------------------------------
def kill_drill(jobs: Jobs, scratch: Path, name: str, site: str, backend: str, kill_at: int, show: Show,
               expect: str, **extra: Any) -> dict[str, Any]:
    run = submit(jobs, scratch, name, site, backend, spares=1, **extra)
    show(f"{name}: submitted {run.name}; waiting for step {kill_at}")
    wait_steps(run / "attempt-1", kill_at, 600, show)
    watcher = Watcher(run, 2)
    watcher.start()
    proc = drill(run, "--kill", str(KILL_RANK))
    report = drill_report(proc)
    if not report.get("detected") or not report.get("culprit_right"):
        settle(run, 1)
        raise Misbehaved(f"drill --kill {KILL_RANK}: not detected as expected: {report}")
    verdict = load_json(run / "attempt-1" / "verdict.json") or {}
    t_verdict = float(verdict["time"])
    if not watcher.wait(300):
        settle(run, 1)
        raise Misbehaved(f"no resumed step within 300 s of the verdict (seen: {breakdown(watcher.seen, t_verdict)})")
    nxt = expect_next(run, 1, expect)
    ends = [e for e in events(run) if e.get("event") == "end" and e.get("attempt") == 1]
    committed = ends[-1].get("committed_step") if ends else None
    reached = last_step(run / "attempt-1")
    first = int(watcher.first["step"])  # type: ignore[index]
    recovery = (load_json(watcher.dir / "record.json") or {}).get("recovery") or {}
    source = recovery.get("resumed_from") or {}
    memory = bool(source.get("memory"))
    held = source.get("step") if memory else committed
    if held is None or first != held + 1:
        raise Misbehaved(f"resumed at step {first}, but the {'snapshot' if memory else 'committed checkpoint'} was {held}"
                         f" ({recovery.get('how')})")
    resume = watcher.seen["first_step"] - t_verdict
    lost = reached - (first - 1)
    killed_at = float(report.get("injected_at") or t_verdict - float(report.get("seconds") or 0))
    starts = [str(r.get("start", "")) for r in rankmanifest.iter_ranks(watcher.dir / MANIFEST) if isinstance(r, dict)]
    warm = sum(1 for text in starts if text.startswith("warm"))
    show(f"{name}: killed rank {KILL_RANK} after step {reached}; verdict {report.get('seconds')} s after the kill;"
         f" next: {nxt.get('how')}{' job ' + str(nxt['next_job']) if nxt.get('next_job') else ''};"
         f" resumed at step {first} ({'memory snapshot' if memory else 'checkpoint'} {held}): resume {resume:.2f} s,"
         f" {lost} steps lost; {warm} of {len(starts)} ranks started warm")
    show(f"  from the verdict: {breakdown({**watcher.seen, **rank_timings(watcher.dir)}, t_verdict)}")
    jobs.cancel_run(run, backend)
    return {"resume_s": round(resume, 2), "steps_lost": lost, "run": run, "detect_s": round(t_verdict - killed_at, 2),
            "kill_to_step_s": round(watcher.seen["first_step"] - killed_at, 2), "warm_ranks": warm,
            "step_s": STEP_COMPUTE_S}


def pretimeout_drill(jobs: Jobs, scratch: Path, steps_before: int, show: Show) -> dict[str, Any]:
    run = submit(jobs, scratch, "lab-pretimeout", "slurm-lab", "slurm")
    show(f"pre-timeout (ours): submitted {run.name}; waiting for step {steps_before}")
    wait_steps(run / "attempt-1", steps_before, 600, show)
    watcher = Watcher(run, 2, previous=run / "attempt-1")
    watcher.start()
    report = drill_report(drill(run, "--pre-timeout"))
    injected = float(report["injected_at"])
    if not report.get("detected"):
        settle(run, 1)
        raise Misbehaved(f"drill --pre-timeout: the attempt did not end with 85: {report}")
    if not watcher.wait(300):
        settle(run, 1)
        raise Misbehaved(f"no resumed step within 300 s of the signal (seen: {breakdown(watcher.seen, injected)})")
    nxt = expect_next(run, 1, "continuation")
    ends = [e for e in events(run) if e.get("event") == "end" and e.get("attempt") == 1]
    committed = ends[-1].get("committed_step") if ends else None
    first = int(watcher.first["step"])  # type: ignore[index]
    if committed is None or first != committed + 1:
        raise Misbehaved(f"resumed at step {first}, but the committed checkpoint was {committed}")
    resume = watcher.seen["first_step"] - injected
    show(f"pre-timeout (ours): USR2 --batch at step {last_step(run / 'attempt-1')}; step {committed} committed; continuation"
         f" job {nxt.get('next_job')}; resumed at step {first}: {resume:.2f} s after the signal")
    show(f"  from the signal: {breakdown({**watcher.seen, **rank_timings(watcher.dir)}, injected)}")
    jobs.cancel_run(run, "slurm")
    return {"resume_s": round(resume, 2)}


PREEMPT_MODEL = {"layers": 2, "hidden": 512, "heads": 8, "vocab": 4096, "ffn": 2048}  # ~10M parameters: 4 ranks save ~0.5 GB
PREEMPT_STEP_S = 0.05  # the stop is taken at the next step: a short one leaves KillWait (2 s) to the save


def preempt_drill(jobs: Jobs, scratch: Path, name: str, site: str, backend: str, warm: bool, steps_before: int,
                  show: Show) -> dict[str, Any]:
    """The job's SIGTERM (scancel, as a preemption or the time limit sends it) once step `steps_before` is done.

    Returns the last step done before the signal and the step committed after
    it (None: nothing saved), and the seconds from the signal to the commit.
    """
    from clusterctl.backends import get_backend
    from clusterctl.checkpoint.generations import latest_committed

    command = [*spec(name, site, scratch)["command"][:-1], f"{PREEMPT_STEP_S:g}"]
    run = submit(jobs, scratch, name, site, backend, model=PREEMPT_MODEL, command=command,
                 restart={"warm": warm}, checkpoint={"interval": 100000, "keep": 1, "memory_interval": 0})
    attempt = run / "attempt-1"
    wait_steps(attempt, steps_before, 600, show)
    (job,) = jobs.ids(run)[:1]
    signalled = time.time()
    if backend == "slurm":
        subprocess.run(["scancel", job], capture_output=True, check=True)
    else:
        get_backend(backend).cancel(job)
    be = get_backend(backend)
    deadline = time.monotonic() + 60
    while (info := be.info(job)) is not None and not info.finished and time.monotonic() < deadline:
        time.sleep(0.2)
    before = [r["step"] for r in records(attempt / "metrics.jsonl") if isinstance(r.get("step"), int) and r["t"] <= signalled]
    saved = latest_committed(run / "checkpoints")
    committed = saved.step if saved else None
    took = round(float(saved.manifest["created"]) - signalled, 2) if saved else None
    kind = "warm" if warm else "cold"
    show(f"preemption ({kind}, {backend}): SIGTERM after step {max(before, default=None)}; committed "
         f"{committed if committed is not None else 'nothing'}" + (f", {took} s after the signal" if took is not None else ""))
    return {"last_step": max(before, default=None), "committed": committed, "signal_to_commit_s": took}


# --- submitit: the same workload, checkpointed and requeued by submitit --------------
def submitit_trainer_class() -> type:
    import submitit

    class Trainer(submitit.helpers.Checkpointable):
        """The reference trainer's workload (clusterctl.trainer.loop pieces), checkpointed by submitit."""

        def __init__(self, workdir: str, settings: dict[str, Any], master_addr: str, step_compute_s: float) -> None:
            self.workdir = workdir
            self.settings = settings
            self.master_addr = master_addr
            self.step_compute_s = step_compute_s
            self._live: Any = None

        def __call__(self) -> None:
            import torch
            from torch.distributed import destroy_process_group

            from clusterctl.trainer import busy, loop
            from clusterctl.trainer.sampler import DistributedSampler

            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
            os.environ["MASTER_ADDR"] = self.master_addr  # the lab's node names do not resolve (see lab_address)
            rank, world, device = loop.setup()
            rate = loop.calibrate_busy(loop.BUSY_CALIBRATION_S, device, world)
            units = round(self.step_compute_s * rate)
            s, model_cfg = self.settings, self.settings.get("model") or {}
            config = loop.TrainConfig(
                micro=s["batch"]["micro"], grad_accum=s["batch"]["grad_accum"], seq_len=s["seq_len"],
                layers=model_cfg["layers"], hidden=model_cfg["hidden"], heads=model_cfg["heads"],
                ffn=model_cfg["ffn"], vocab=model_cfg["vocab"], eval_interval=0,
            )
            model, data = loop.build(config, device)
            model = loop.wrap(model, config, device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
            sampler = DistributedSampler(loop.DATASET_SIZE, rank, world, seed=config.seed)
            ckpt = Path(self.workdir) / "ckpt.pt"
            start = 0
            if ckpt.exists():
                state = torch.load(ckpt, weights_only=False)
                model.module.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optim"])
                sampler.load_state_dict(state["sampler"])
                start = state["step"] + 1
            restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
            metrics = open(Path(self.workdir) / "metrics.jsonl", "a") if rank == 0 else None
            if rank == 0:
                print(f"training from step {start} (restart {restart})", flush=True)
            for step in range(start, TOTAL_STEPS):
                t0 = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss = loop.loss_of(model, data.batch(sampler.take(config.micro)), device)
                loss.backward()
                busy.spin(units)
                optimizer.step()
                mean = loss.detach().double()
                torch.distributed.all_reduce(mean)
                if rank == 0:
                    self._live = (model, optimizer, sampler, step)
                    metrics.write(json.dumps({"step": step, "loss": float(mean) / world, "restart": restart,
                                              "step_s": round(time.perf_counter() - t0, 6)}) + "\n")
                    metrics.flush()
            destroy_process_group()

        def checkpoint(self) -> Any:  # submitit calls it on rank 0, from its USR2 handler, then requeues
            import torch

            if self._live is not None:
                model, optimizer, sampler, step = self._live
                tmp = Path(self.workdir) / "ckpt.pt.tmp"
                torch.save({"model": model.module.state_dict(), "optim": optimizer.state_dict(),
                            "sampler": sampler.state_dict(), "step": step}, tmp)
                os.replace(tmp, Path(self.workdir) / "ckpt.pt")
                (Path(self.workdir) / "checkpointed").write_text(json.dumps({"step": step, "time": time.time()}))
            self._live = None  # torch objects stay out of the pickle
            return super().checkpoint()

    return Trainer


def submitit_drill(jobs: Jobs, scratch: Path, settings: dict[str, Any], steps_before: int, show: Show) -> dict[str, Any]:
    import submitit

    workdir = scratch / "submitit-run"
    workdir.mkdir()
    executor = submitit.AutoExecutor(folder=str(scratch / "submitit" / "%j"), cluster="slurm")
    executor.update_parameters(
        name="bench-submitit", nodes=2, tasks_per_node=2, gpus_per_node=2, cpus_per_task=1, timeout_min=30,
        slurm_partition="gpu",
    )
    trainer = submitit_trainer_class()(str(workdir), settings, lab_address(), STEP_COMPUTE_S)
    job = executor.submit(trainer)
    jobs.submitit.append(str(job.job_id))
    sbatch = next((scratch / "submitit").glob("*/*_submission.sh"), None)
    signal_line = next((ln for ln in sbatch.read_text().splitlines() if "--signal" in ln), "") if sbatch else ""
    show(f"pre-timeout (submitit): job {job.job_id} ({signal_line.strip() or 'no --signal line'}); waiting for step {steps_before}")
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while True:
        got = records(metrics)
        if got and got[-1]["step"] >= steps_before:
            break
        if time.monotonic() > deadline or scontrol_job(str(job.job_id)).get("JobState") in ENDED:
            raise Misbehaved(f"submitit job {job.job_id} did not reach step {steps_before}: {job.paths.stdout}")
        time.sleep(0.2)
    reached = got[-1]["step"]
    injected = time.time()
    sent = subprocess.run(["scancel", "--signal=USR2", str(job.job_id)], capture_output=True, text=True, check=False)
    if sent.returncode != 0:
        raise Misbehaved(f"scancel --signal=USR2 {job.job_id}: {sent.stderr.strip()}")
    seen: dict[str, float] = {}
    first: dict[str, Any] | None = None
    deadline = time.monotonic() + 300
    while first is None:
        now = time.time()
        if (workdir / "checkpointed").exists():
            seen.setdefault("checkpointed", now)
        info = scontrol_job(str(job.job_id))
        if int(info.get("Restarts") or 0) >= 1:
            seen.setdefault("requeued", now)
            if info.get("JobState") == "RUNNING":
                seen.setdefault("running_again", now)
        for r in records(metrics):
            if r.get("restart", 0) >= 1:
                first = r
                seen["first_step"] = now
                break
        if time.monotonic() > deadline:
            raise Misbehaved(f"submitit job {job.job_id}: no resumed step within 300 s ({seen}); see {job.paths.stdout}")
        time.sleep(POLL_S)
    resume = seen["first_step"] - injected
    ck = load_json(workdir / "checkpointed") or {}
    show(f"pre-timeout (submitit): USR2 to the steps at step {reached}; checkpoint of step {ck.get('step')}; resumed at step"
         f" {first['step']}: {resume:.2f} s after the signal")
    show("  from the signal: " + ", ".join(f"{k} +{v - injected:.1f}" for k, v in seen.items()))
    subprocess.run(["scancel", str(job.job_id)], capture_output=True, check=False)
    return {"resume_s": round(resume, 2)}


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "")


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False)
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout)) if out.returncode == 0 else {}


# --- the lab -------------------------------------------------------------------------
def lab_up(show: Show, allow_up: bool) -> bool:
    if not LAB.exists():
        return False
    if subprocess.run(["bash", str(LAB), "status"], capture_output=True, check=False).returncode != 0:
        if not allow_up:
            return False
        show("the Slurm test cluster is down: tests/slurmlab/lab.sh up")
        if subprocess.run(["bash", str(LAB), "up"], capture_output=True, check=False).returncode != 0:
            return False
    env = subprocess.run(["bash", str(LAB), "env"], capture_output=True, text=True, check=False).stdout
    for key, value in re.findall(r"export (\w+)=(\S+)", env):
        os.environ[key] = value.strip("'\"")
    return bool(os.environ.get("SLURM_CONF")) and shutil.which("sbatch") is not None


def lab_address() -> str:
    """The rendezvous address for a submitit job: the lab's node names do not resolve, and its site's
    address table maps every node to one address (this machine)."""
    import yaml

    site = yaml.safe_load((REPO / "site-configs" / "slurm-lab.yaml").read_text())
    addresses = set((site.get("network") or {}).get("addresses", {}).values())
    if len(addresses) != 1:
        raise RuntimeError(f"slurm-lab's address table maps its nodes to {sorted(addresses)}: expected one address")
    return str(addresses.pop())


def lab_nodes() -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, check=False).stdout
    return ", ".join(" ".join(line.split()) for line in out.splitlines())


def job_settings(scratch: Path) -> dict[str, Any]:
    """run.json of the lab spec (a dry run: nothing submitted): the workload the submitit job repeats."""
    from clusterctl.actions.submit import submit_job
    from clusterctl.plan.job import load_job

    path = scratch / "settings.yaml"
    path.write_text(json.dumps(spec("lab-settings", "slurm-lab", scratch / "dry-runs")))
    return load_json(submit_job(load_job(path), "slurm", dry_run=True).run.run_json) or {}


PARTS = ("local", "inalloc", "newjob", "pretimeout", "submitit", "warm", "cold", "preempt")
WARM = {"restart": {"warm": True}, "checkpoint": {"interval": INTERVAL, "keep": 2, "memory_interval": 1}}
COLD = {"restart": {"warm": False}, "checkpoint": {"interval": INTERVAL, "keep": 2, "memory_interval": 0}}
# Goodput of a large job (bench/README.md states the model): Llama 3's 419 interruptions in 54 days on 16,384 GPUs.
INTERRUPTION_EVERY_S = 54 * 86400 / 419
NEW_JOB_WAIT_S = 60.0  # a new job per failure waits at least one pass of Slurm's default scheduler (sched_interval=60)


def goodput(lost_s: float) -> float:
    """The share of wall time that trains when each interruption costs lost_s (recomputed steps included)."""
    return round(INTERRUPTION_EVERY_S / (INTERRUPTION_EVERY_S + lost_s), 5)


def warm_cold(result: dict[str, Any], warm: dict[str, Any] | None, cold: dict[str, Any] | None, prefix: str = "") -> None:
    """The warm-against-cold keys of one backend, and the goodput model from its figures."""
    for name, got in (("warm", warm), ("cold", cold)):
        result[f"{prefix}{name}_resume_s"] = got["resume_s"] if got else None
        result[f"{prefix}{name}_steps_lost"] = got["steps_lost"] if got else None
        result[f"{prefix}{name}_kill_to_step_s"] = got["kill_to_step_s"] if got else None
    result[f"{prefix}warm_vs_cold"] = round(warm["resume_s"] / cold["resume_s"], 3) if warm and cold else None
    if warm and cold:
        cost = {name: got["detect_s"] + got["resume_s"] + got["steps_lost"] * got["step_s"]
                for name, got in (("warm", warm), ("cold", cold))}
        cost["new_job"] = cost["cold"] + NEW_JOB_WAIT_S
        result[f"{prefix}goodput_16k"] = {name: goodput(lost) for name, lost in cost.items()}
    else:
        result[f"{prefix}goodput_16k"] = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="warm and cold kill drills and preemptions on the local backend only, after step 12 (about 3 min)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    parts = set(args.parts.split(",")) if not args.quick else {"warm", "cold", "preempt"}
    if parts - set(PARTS):
        parser.error(f"unknown part(s): {', '.join(sorted(parts - set(PARTS)))}")
    os.environ.setdefault("PYTHONPATH", str(REPO))

    def show(text: str) -> None:
        print(text, flush=True)

    from clusterctl.errors import ClusterctlError

    scratch = Path(tempfile.mkdtemp(prefix="clusterctl-recovery-"))
    os.environ["CLUSTERCTL_LOCAL_STATE"] = str(scratch / "local-state")
    result: dict[str, Any] = {"resume_s": None, "steps_lost": None, "checkpoint_interval": INTERVAL,
                              "inalloc_vs_newjob_ratio": None, "ratio_vs_submitit": None}
    jobs = Jobs()
    keep = args.keep
    kill_at = 12 if args.quick else 15
    errors: dict[str, str] = {}

    def part(name: str, measure: Callable[[], Any]) -> Any:
        """One measurement; a failure is reported and recorded, and the next part still runs."""
        nonlocal keep
        if name not in parts:
            return None
        runs_before = len(jobs.runs)
        try:
            return measure()
        except (Misbehaved, RuntimeError, ClusterctlError) as exc:
            keep = True
            text = exc.message if isinstance(exc, ClusterctlError) else str(exc)
            show(f"{name}: {'RECOVERY MISBEHAVED' if isinstance(exc, Misbehaved) else 'FAILED'}: {text}")
            for run, _ in jobs.runs[runs_before:]:
                show(describe(run))
            errors[name] = text
            return None
        finally:
            for run, backend in jobs.runs[runs_before:]:
                jobs.cancel_run(run, backend)

    try:
        local = part("local", lambda: kill_drill(jobs, scratch, "local-kill", "local", "local", kill_at, show, "allocation"))
        if local:
            result["resume_s"], result["steps_lost"] = local["resume_s"], local["steps_lost"]
        warm = part("warm", lambda: kill_drill(jobs, scratch, "local-warm", "local", "local", kill_at, show, "allocation",
                                               **WARM))
        cold = part("cold", lambda: kill_drill(jobs, scratch, "local-cold", "local", "local", kill_at, show, "allocation",
                                               **COLD))
        if {"warm", "cold"} & parts:
            warm_cold(result, warm, cold)
        local_parts = {"local", "warm", "cold", "preempt"}  # the local backend's; --quick runs no other
        if parts - local_parts or ({"warm", "cold", "preempt"} & parts and not args.quick):
            lab_ok = lab_up(show, allow_up=True)
            if lab_ok:
                show(f"slurm-lab nodes: {lab_nodes()}")
            else:
                show("slurm-lab: the Slurm test cluster is not up; its figures are null")
                parts &= local_parts
        else:
            lab_ok = False
        if {"warm", "cold"} & parts and not args.quick and lab_ok:
            labwarm = part("warm", lambda: kill_drill(jobs, scratch, "lab-warm", "slurm-lab", "slurm", kill_at, show,
                                                      "allocation", **WARM))
            labcold = part("cold", lambda: kill_drill(jobs, scratch, "lab-cold", "slurm-lab", "slurm", kill_at, show,
                                                      "allocation", **COLD))
            warm_cold(result, labwarm, labcold, prefix="lab_")
        inalloc = part("inalloc", lambda: kill_drill(jobs, scratch, "lab-kill-inalloc", "slurm-lab", "slurm", kill_at, show,
                                                     "allocation"))
        newjob = part("newjob", lambda: kill_drill(jobs, scratch, "lab-kill-newjob", "slurm-lab", "slurm", kill_at, show,
                                                   "continuation", restart={"in_allocation": False}))
        if inalloc:
            result["resume_inalloc_s"], result["steps_lost_inalloc"] = inalloc["resume_s"], inalloc["steps_lost"]
        if newjob:
            result["resume_newjob_s"], result["steps_lost_newjob"] = newjob["resume_s"], newjob["steps_lost"]
        if inalloc and newjob:
            result["inalloc_vs_newjob_ratio"] = round(inalloc["resume_s"] / newjob["resume_s"], 3)
        ours = part("pretimeout", lambda: pretimeout_drill(jobs, scratch, kill_at, show))
        theirs = None
        if "submitit" in parts:
            try:
                import submitit  # noqa: F401
            except ImportError:
                show("submitit is not installed (pip install 'clusterctl[submitit]'): ratio_vs_submitit is null")
            else:
                theirs = part("submitit", lambda: submitit_drill(jobs, scratch, job_settings(scratch), kill_at, show))
        preempt = {kind: part("preempt", lambda kind=kind: preempt_drill(
            jobs, scratch, f"local-preempt-{kind}", "local", "local", kind == "warm", kill_at, show))
            for kind in ("warm", "cold")}
        if lab_ok and not args.quick:
            preempt.update({f"lab_{kind}": part("preempt", lambda kind=kind: preempt_drill(
                jobs, scratch, f"lab-preempt-{kind}", "slurm-lab", "slurm", kind == "warm", kill_at, show))
                for kind in ("warm", "cold")})
        if "preempt" in parts:
            result["preempt_saved"] = preempt
        if ours:
            result["pretimeout_resume_s"] = ours["resume_s"]
        if theirs:
            result["submitit_resume_s"] = theirs["resume_s"]
        if ours and theirs:
            result["ratio_vs_submitit"] = round(ours["resume_s"] / theirs["resume_s"], 3)
    finally:
        jobs.cancel_all()
        if keep:
            show(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if errors:
        result["errors"] = errors
    print(json.dumps(result))


if __name__ == "__main__":
    main()
