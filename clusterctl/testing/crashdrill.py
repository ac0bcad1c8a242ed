"""Crash drill: kill the writers at random points of saves and check what survives.

Each trial forks `world_size` ranks (from a parent that already imported
torch) that resume from the newest committed generation and save a few more
steps (sync and async mixed) into one shared directory. Every rank reports
each phase it enters (see phases.py) to an append-only event file. A trial
kills all ranks at once, either when one of them enters a chosen phase for
the n-th time (so every phase is hit) or after a random delay (so the kill
also lands between phases). Then the parent checks that `latest_committed`
is the newest generation whose commit rename had happened, that it verifies
(sizes, checksums) and loads, and that its tensors and per-rank extras are
exactly those of its step; and that no committed name is torn.

A killed process keeps what it wrote in the page cache, so this proves the
ordering of names (temporary, rename, retention) under crashes; fsyncs are
what carries the same ordering across a power loss, which no process kill
can show.
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from clusterctl.checkpoint import names, phases
from clusterctl.checkpoint.generations import latest_committed, list_generations
from clusterctl.checkpoint.verify import verify
from clusterctl.testing import localworld

BETWEEN = "between_phases"  # a timed kill that landed before any phase of its save
_SIZES = (4096, 1000, 65536, 7, 20000, 131072)  # float32 elements per tensor


def expected_state(step: int) -> dict[str, Any]:
    """The DCP state every rank saves at `step` (replicated: DCP spreads it over ranks)."""
    model = {f"layer{i}.weight": torch.arange(n, dtype=torch.float32) * 0.5 + step for i, n in enumerate(_SIZES)}
    optim = {"state": {i: {"exp_avg": torch.full((n,), float(step))} for i, n in enumerate(_SIZES[:2])}}
    return {"model": model, "optim": optim, "scaler": {"scale": 2.0 ** (step % 16), "growth_tracker": step}}


def expected_extra(step: int, rank: int) -> dict[str, Any]:
    return {"epoch": step // 7, "data_position": step * 64, "rng": [rank, step, rank * 1000 + step]}


@dataclass
class TrialPlan:
    kind: str  # "phase" | "timed" | "none"
    phase: str | None = None
    rank: int = 0
    nth: int = 1
    delay: float = 0.0
    asynchronous: tuple[bool, ...] = (False, False, False)


def _rank_main(rank: int, world_size: int, directory: str, events: str, plan: TrialPlan, keep: int) -> None:
    from clusterctl.checkpoint.checkpointer import Checkpointer

    fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seen: Counter[str] = Counter()

    def log(what: str, step: int) -> None:
        os.write(fd, f"{time.monotonic():.6f} {rank} {what} {step}\n".encode())

    def hook(phase: str, step: int) -> None:
        log(phase, step)
        seen[phase] += 1
        if plan.kind == "phase" and phase == plan.phase and rank == plan.rank and seen[phase] == plan.nth:
            log("kill", step)
            os.killpg(os.getpgrp(), signal.SIGKILL)

    phases.set_hook(hook)
    ck = Checkpointer(directory, keep=keep, rank=rank, world_size=world_size, stale_after=0.0)
    latest = ck.latest()
    start = latest.step + 1 if latest is not None else 1
    log("ready", start)
    for i, use_async in enumerate(plan.asynchronous):
        step = start + i
        state = expected_state(step)
        ck.save(step, state, expected_extra(step, rank), asynchronous=use_async)
        for tensor in state["model"].values():  # training goes on at once
            tensor.add_(1000.0)
    ck.close()
    log("done", start + len(plan.asynchronous) - 1)


@dataclass
class DrillReport:
    trials: int = 0
    kills: int = 0
    phases_hit: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    latest_steps: list[int] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "trials": self.trials,
            "unkilled_runs": len(self.unreached),
            "phases_hit": dict(sorted(self.phases_hit.items())),
            "phases_missed": [p for p in phases.PHASES if not self.phases_hit.get(p)],
            "failures": len(self.failures),
            "seconds": round(self.seconds, 2),
        }


def _read_events(path: Path) -> list[tuple[float, int, str, int]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((float(parts[0]), int(parts[1]), parts[2], int(parts[3])))
    return out


def _check(
    directory: Path, known: int | None, maybe: int | None, keep: int, finished: bool
) -> tuple[int | None, list[str]]:
    """The checks after a trial; (the newest committed step now known, problems)."""
    problems: list[str] = []
    gen = latest_committed(directory)
    got = gen.step if gen is not None else None
    allowed = {known} | ({maybe} if maybe is not None else set())
    if got not in allowed:
        problems.append(f"latest_committed is step {got}, expected one of {sorted(allowed, key=str)}")
    for info in list_generations(directory):
        if info.kind == "torn":
            problems.append(f"torn committed generation {info.name}: {info.problem}")
    committed = [i for i in list_generations(directory) if i.kind == names.COMMITTED]
    if finished and len(committed) > keep:  # a kill may skip a retention; a finished run may not
        problems.append(f"{len(committed)} committed generations after a finished run with keep={keep}")
    if gen is None:
        return got, problems
    problems += verify(gen)
    if problems:
        return got, problems
    template = expected_state(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process": that is the intent
        dcp.load(template, checkpoint_id=gen.path, no_dist=True)
    want = expected_state(gen.step)
    pairs = [(f"model.{k}", template["model"][k], t) for k, t in want["model"].items()]
    pairs += [(f"optim.state.{i}.exp_avg", template["optim"]["state"][i]["exp_avg"], s["exp_avg"])
              for i, s in want["optim"]["state"].items()]
    for name, got_t, want_t in pairs:
        if not torch.equal(got_t.view(torch.int32), want_t.view(torch.int32)):
            problems.append(f"step {gen.step}: {name} differs from the state of its step")
    if template["scaler"] != want["scaler"]:
        problems.append(f"step {gen.step}: scaler state {template['scaler']} != {want['scaler']}")
    for rank, extra in enumerate(gen.manifest["ranks"]):
        if extra != expected_extra(gen.step, rank):
            problems.append(f"step {gen.step}: rank {rank}'s extra {extra} is not that of its step")
    return got, problems


def _plan(
    rng: random.Random,
    order: list[str],
    counts: Counter,
    world_size: int,
    saves: int,
    timed_fraction: float,
    window: float,
    stale: bool,
) -> TrialPlan:
    if rng.random() < timed_fraction:
        plan = TrialPlan("timed", delay=rng.uniform(0.0, window))
    else:
        if not order:
            order.extend(phases.PHASES)
            rng.shuffle(order)
        phase = order.pop()
        if phase == phases.CLEANUP and not stale and order:  # nothing to clean up yet: later
            order.insert(0, phase)
            phase = order.pop()
        ranks = [r for r in range(world_size) if counts[(phase, r)]] or [0]
        rank = rng.choice(ranks)
        plan = TrialPlan("phase", phase=phase, rank=rank, nth=rng.randint(1, max(1, counts[(phase, rank)])))
    plan.asynchronous = tuple(rng.random() < 0.5 for _ in range(saves))
    return plan


def _trial(directory: Path, plan: TrialPlan, world_size: int, keep: int, timeout: float) -> tuple[list, float | None, bool]:
    """Run one trial; (its events, when a timed kill was sent, whether every rank ended)."""
    with tempfile.TemporaryDirectory(prefix="drill-") as tmp:
        events = Path(tmp) / "events"
        pids = localworld.spawn_ranks(world_size, _rank_main, (str(directory), str(events), plan, keep), Path(tmp))
        killed_at = None
        if plan.kind == "timed":
            ready_by = time.monotonic() + timeout
            while not any(e[2] == "ready" for e in _read_events(events)) and time.monotonic() < ready_by:
                time.sleep(0.002)
            time.sleep(plan.delay)
            killed_at = time.monotonic()
            localworld.signal_all(pids)
        status = localworld.reap(pids, timeout)
        ended = all(code is not None for code in status.values())
        if not ended:
            localworld.kill_all(pids)
        return _read_events(events), killed_at, ended


def run(
    directory: Path,
    trials: int,
    *,
    seed: int = 0,
    world_size: int = 2,
    keep: int = 2,
    saves: int = 3,
    timed_fraction: float = 0.3,
    trial_timeout: float = 60.0,
) -> DrillReport:
    """Kill saves in `directory` until `trials` kills have landed, checking after every run.

    A first run without a kill calibrates (how long a trial's saves take, how
    often each rank enters each phase); a run whose kill point is not reached
    (nothing stale to clean, the saves ended before the delay) is checked as
    well but not counted as a trial.
    """
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    report = DrillReport()
    known: int | None = None
    counts: Counter[tuple[str, int]] = Counter()
    window = 0.5
    order: list[str] = []
    t_start = time.perf_counter()
    runs = 0
    stale = False
    while runs == 0 or (report.kills < trials and runs <= 2 * trials + 10):
        calibrating = runs == 0
        plan = TrialPlan("none", asynchronous=(False,) * saves) if calibrating else _plan(
            rng, order, counts, world_size, saves, timed_fraction, window, stale
        )
        evs, killed_at, ended = _trial(directory, plan, world_size, keep, trial_timeout)
        runs += 1
        if not ended:
            report.failures.append(f"run {runs}: ranks still running after {trial_timeout} s ({plan})")
        done = any(e[2] == "done" for e in evs)
        if calibrating:
            counts = Counter((what, rank) for _, rank, what, _ in evs if what in phases.PHASES)
            ready = [t for t, _, what, _ in evs if what == "ready"]
            finished = [t for t, _, what, _ in evs if what == "done"]
            window = max(0.05, 0.9 * (max(finished) - min(ready))) if ready and finished else 0.5
            if not done:
                report.failures.append("the calibration run (no kill) did not finish")
        elif any(e[2] == "kill" for e in evs):
            report.kills += 1
            report.phases_hit[plan.phase or BETWEEN] += 1
        elif plan.kind == "timed" and not done:
            report.kills += 1
            ready_t = min((t for t, _, what, _ in evs if what == "ready"), default=0.0)
            before = [e for e in evs if e[2] in phases.PHASES and ready_t <= e[0] <= (killed_at or 0.0)]
            report.phases_hit[before[-1][2] if before else BETWEEN] += 1
        elif plan.kind == "phase" and plan.phase is not None:
            order.insert(0, plan.phase)  # not reached (e.g. nothing stale to clean): after the others
            report.unreached.append(f"{plan.phase}@rank{plan.rank}#{plan.nth}")
        else:
            report.unreached.append(f"timed {plan.delay:.3f} s")
        committed = [step for _, _, what, step in evs if what == phases.COMMITTED]
        renamed = [step for _, _, what, step in evs if what == phases.RENAME]
        if committed:
            known = max(committed + ([known] if known is not None else []))
        maybe = max(renamed) if renamed and (known is None or max(renamed) > known) else None
        got, problems = _check(directory, known, maybe, keep, finished=done)
        if got is not None and (known is None or got > known):
            known = got
        report.failures += [f"run {runs} ({plan.kind} {plan.phase or ''}): {p}" for p in problems]
        if not calibrating:
            report.latest_steps.append(got if got is not None else -1)
        stale = any(i.kind == names.TEMPORARY for i in list_generations(directory))
    report.trials = report.kills
    report.seconds = time.perf_counter() - t_start
    return report
