"""The watchdog: hang and straggler verdicts from the ranks' heartbeats, while training runs.

Pure: it is fed the aggregators' rows (a rank's heartbeat messages of a
second, runtime/wire/heartbeat.py; `observe` takes one message as a row),
process facts and lost aggregators with the time they were received, and
asked `verdict(now)`; it does no I/O and reads no clock, so every rule is
tested with made-up timelines. Nothing a check reads walks every rank: a
100,000-rank world is judged from tallies and the straggler's columns. The watch
server (runtime/controller/watchserver.py) feeds it; the controller acts on what it says.

Rules (docs/design/watchdog.md says the same):

* Hang (82): no rank made progress (a phase change or a finished step) for
  the hang timeout. After warm-up the timeout is `HANG_MULTIPLE` times the
  median step time of the recent window, at least `HANG_FLOOR_S` and at most
  `watchdog.hang_timeout`; during warm-up, an evaluation or before the first
  step it is `watchdog.hang_timeout`; while a rank saves a checkpoint it is
  `PHASE_MULTIPLE` times the longest save this run measured (from the
  first rank in to the last one out; earlier attempts' too), at least
  `PHASE_FLOOR_S` and at most `watchdog.save_timeout` (that bound itself
  before the run's first save ended), and while one loads a checkpoint the
  same from the earlier attempts' loads of a committed checkpoint and
  `watchdog.load_timeout` — but a rank whose process stopped, or whose
  liveness beat stayed silent for the step's timeout while its peers beat
  on, is judged at the step's timeout in every phase. The culprit is, in this order: the rank whose
  process is stopped or whose liveness beat stopped; the rank that never
  entered the collective its peers wait in; the rank behind its peers' step.
  The ranks waiting for it are victims, never culprits.
* Lost node (86): a node's aggregator vanished without saying goodbye and
  stayed gone for `NODE_LOST_CONFIRM_S`: said at once, rather than when srun
  ends, which on a dead node waits until Slurm declares it down.
* Straggler (83): runtime/controller/straggler.py's rule, one place: over the last
  `watchdog.window` steps every rank reported, a rank's compute time at each
  step is set against its peers' median at that step; its excess, averaged
  with its most extreme steps left out, must exceed `watchdog.straggler_factor`
  over its peers and the floors `watchdog.straggler_min_compute_s` and
  `watchdog.straggler_min_lost_s` (seconds a step) — and the same rank must
  stay the straggler for `PERSIST_STEPS` steps, since noise flickers and a
  slow GPU persists. A rank that stalls on some steps only is judged with
  every step counted, over `straggler.RECUR_WINDOWS` windows in a row, each
  with its stalls: the spikes the trim leaves out do not come back, its
  stalls do. Peers only, within one attempt, after its first window: a
  machine-wide slowdown is nobody's straggler, and a rank's own earlier steps
  are no baseline.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.runjson import WatchdogRecord
from clusterctl.rundir.verdict import FAULT_AMBIGUOUS, FAULT_NODE, Verdict
from clusterctl.runtime.controller import straggler
from clusterctl.runtime.controller.blame import EVIDENCE_RANKS, Facts, TaskEnd, lost_node_verdict, name_victims
from clusterctl.runtime.controller.stepcolumns import StepColumns
from clusterctl.runtime.wire import heartbeat as wire
from clusterctl.runtime.wire.heartbeat import GONE

HANG_MULTIPLE = 5.0
HANG_FLOOR_S = 3.0
LIVENESS_TIMEOUT_S = 4.0  # beats come every second: four missed in a row
WARMUP_STEPS = 5
PERSIST_STEPS = 5  # a straggler must stay one this many steps: noise flickers, a slow GPU persists
PHASE_MULTIPLE = 5.0  # a save or load may take this many times the longest one this run measured...
PHASE_FLOOR_S = 60.0  # ...and at least this long: a busier filesystem, a larger shard, a cold cache
MEASURED_PHASES = ("save", "load")
NODE_LOST_CONFIRM_S = 3.0  # an aggregator gone without goodbye this long: its node is lost (not an attempt ending)
WAITING_PHASES = ("collective",)
TIMEOUT_SAMPLE = 1024  # ranks whose step times set the hang timeout (evenly spread): every one of a smaller world


def straggler_warmup(window: int) -> int:
    """Steps of each attempt the straggler rule leaves out: the attempt's first window (at least WARMUP_STEPS).

    A restart's first steps, warm or cold, change the ranks' paces unevenly (page-ins, the allocator, in-memory
    replicas sent to new peers): the soak's false verdicts on healthy ranks (1.26-1.38x their peers, on the 2-core
    test cluster) all came in the attempt right after a warm restart."""
    return max(WARMUP_STEPS, window)


@dataclass(slots=True)  # 100,000 of them, each written to every second: slots make that a third cheaper
class RankState:
    rank: int
    node: str = ""
    pid: int | None = None
    gpu: int | None = None
    phase: str = "start"
    step: int = -1
    last_beat: float | None = None
    last_progress: float | None = None
    phase_since: float | None = None
    steps_done: int = 0
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    process: str | None = None  # the aggregator's view: running, sleeping, stopped, gone
    closed: bool = False  # the rank's training loop said it is done
    sent: float = 0.0  # the sender's time of the latest phase news applied
    gone_at: float | None = None


class Watchdog:
    def __init__(self, world: int, hosts: list[str], gpus_per_node: int, settings: WatchdogRecord,
                 earlier: dict[str, float] | None = None) -> None:
        """`earlier`: the longest save and durable load of this run's earlier attempts (rundir/phasetimes.py)."""
        self.world = world
        self.hosts = hosts
        self.gpn = gpus_per_node
        self.settings = settings
        self.ranks = [RankState(r, node=hosts[r // gpus_per_node] if hosts else "") for r in range(world)]
        self.started: float | None = None
        self.last_progress: float | None = None
        self.gpu_samples: dict[str, dict[str, Any]] = {}  # node -> latest sample per GPU
        self.lost_nodes: dict[str, float] = {}  # node -> when its aggregator vanished without goodbye
        self._suspect: tuple[int, int] | None = None  # (rank, step when first flagged)
        self.longest: dict[str, float] = {}  # save/load -> the longest one every rank finished in this attempt, seconds
        self.earlier = dict(earlier or {})  # save/load -> the longest of this run's earlier attempts, seconds
        self._round: dict[str, float] = {}  # save/load -> when the first rank entered the one under way
        self.columns = StepColumns(world, straggler.RECUR_WINDOWS * settings.window, straggler_warmup(settings.window))
        self._node_ids = straggler.node_ids([r.node for r in self.ranks])  # the rule sets a loss against other nodes'
        self._judged = -1  # the columns the straggler rule last judged (StepColumns.made)
        # Tallies kept as the ranks change, so a check reads them instead of every rank (100,000 a check):
        self._live_in: dict[str, int] = {"start": world}  # phase -> ranks in it whose process is not gone
        self._open_in: dict[str, int] = {"start": world}  # ... and whose loop has not closed
        self._ended = 0  # ranks whose process is gone or whose loop closed
        self._digests: dict[int, wire.RankDigest] = {}  # rank -> its messages' digest, for `observe` one at a time

    # --- input -------------------------------------------------------------------
    def observe(self, msg: dict[str, Any], received: float) -> None:
        """One heartbeat message ({kind, rank, step, phase, step_s, compute_s, pid, gpu}), as a one-message row."""
        rank = msg.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < self.world:
            return
        digest = self._digests.get(rank)
        if digest is None:
            digest = self._digests[rank] = wire.RankDigest(rank)
        digest.take(msg)
        row = digest.row()
        if row is not None:
            self.observe_row(tuple(row), received)

    def observe_row(self, row: tuple[Any, ...], received: float) -> None:
        """A batch's row for one rank (wire/heartbeat.py ROW, parse_row's): what its messages since the last
        batch said, applied as they would be one by one, at the time the batch was received."""
        rank, pid, gpu, phase, step, sent, moved, closed, done, changes, steps = row
        if not 0 <= rank < self.world:
            return
        state = self.ranks[rank]
        if self.started is None:
            self.started = received
        state.last_beat = received
        if pid:
            state.pid = pid
        if gpu is not None:
            state.gpu = gpu
        if moved:
            if sent > state.sent:
                state.sent = sent
            state.last_progress = self.last_progress = received
        state.steps_done += done
        if steps:
            times, add = state.step_times, self.columns.add
            for at_step, _, _, step_s, compute_s in steps:
                if step_s is not None:
                    times.append(float(step_s))
                if compute_s is not None:
                    add(rank, at_step, float(compute_s))
        for entered, _, _ in changes:
            if entered != state.phase:
                self._enter(state, entered, received)
        if phase != state.phase:
            self._enter(state, phase, received)  # the last phase, whatever changes a full batch left out
        state.step = step
        if moved and phase in MEASURED_PHASES:
            self._round.setdefault(phase, received)
        if closed and not state.closed:
            self._tally(state, -1)
            state.closed = True
            self._tally(state, 1)
            if state.phase in self._round:  # a stop's save is the rank's last phase: its loop closing ends it
                self._round_ended(state.phase, received)

    def _enter(self, state: RankState, phase: str, received: float) -> None:
        """The rank changed phase: the tallies, its time in the phase, and the save and load rounds."""
        left = state.phase
        if phase == left:
            return
        self._tally(state, -1)
        state.phase = phase
        self._tally(state, 1)
        state.phase_since = received
        if phase in MEASURED_PHASES:
            self._round.setdefault(phase, received)
        if left in MEASURED_PHASES and left in self._round:
            self._round_ended(left, received)

    def _round_ended(self, phase: str, now: float) -> None:
        """A save or load is measured once every live rank is out of it, from the first rank's start to the last
        one's end: where one rank writes what the others do not (rank 0's full state), the others' quick exits are
        not its length."""
        if self._open_in.get(phase):
            return
        took = now - self._round.pop(phase)
        self.longest[phase] = max(took, self.longest.get(phase, 0.0))

    def _tally(self, state: RankState, sign: int) -> None:
        """Count the rank out (-1) before its phase, process or loop changes, and in (+1) after."""
        if state.process != GONE:
            self._live_in[state.phase] = self._live_in.get(state.phase, 0) + sign
            if not state.closed:
                self._open_in[state.phase] = self._open_in.get(state.phase, 0) + sign
        if state.process == GONE or state.closed:
            self._ended += sign

    def observe_process(self, rank: int, status: str, when: float) -> None:
        """The aggregator saw the rank's process `running`, `sleeping`, `stopped` or `gone`."""
        if 0 <= rank < self.world:
            state = self.ranks[rank]
            if status != state.process:
                self._tally(state, -1)
                state.process = status
                self._tally(state, 1)
            if status == GONE and state.gone_at is None:
                state.gone_at = when

    def observe_gpus(self, node: str, sample: dict[str, Any]) -> None:
        self.gpu_samples[node] = sample

    def observe_node_lost(self, node: str, when: float) -> None:
        """A node's aggregator vanished without saying goodbye."""
        self.lost_nodes.setdefault(node, when)

    # --- what it says ------------------------------------------------------------------
    def verdict(self, now: float) -> Verdict | None:
        """The verdict due now while the ranks train, or None: a lost node, else a hang or a straggler.

        Once ranks are ending (a process gone, a loop closed) the end-of-attempt blame decides, not the clock.
        """
        if self.lost_nodes:
            node, when = min(self.lost_nodes.items(), key=lambda item: item[1])
            if now - when < NODE_LOST_CONFIRM_S:
                return None
            return lost_node_verdict(self.facts(), node, when)
        if self._ended:
            return None
        return self.check(now)

    def accounted(self) -> bool:
        """Each rank's end seen, or never to be seen (no process known, its node lost)."""
        return all(r.process == GONE or r.pid is None or r.node in self.lost_nodes for r in self.ranks)

    def facts(
        self, gpus: dict[int, Any] | None = None, errors: dict[int, str] | None = None, srun: list[TaskEnd] | None = None,
        failed_nodes: set[str] | None = None,
    ) -> Facts:
        """What the blame (runtime/controller/blame.py) decides from: these, and when each rank's process was seen gone."""
        deaths = {r.rank: r.gone_at for r in self.ranks if r.gone_at is not None}
        return Facts(self.world, self.hosts, self.gpn, gpus or {}, errors or {}, srun or [], deaths, dict(self.lost_nodes),
                     failed_nodes or set())

    # --- rules ---------------------------------------------------------------------
    def hang_timeout(self) -> tuple[float, str]:
        """The no-progress time that makes a hang now, and why that much."""
        return self._phase_timeout() or self._step_timeout()

    def _phase_timeout(self) -> tuple[float, str] | None:
        """The configured bound while a live rank saves, loads or evaluates: those may take far longer than a step."""
        s = self.settings
        if self._live_in.get("save"):
            return self._measured("save", s.save_timeout, "a checkpoint save is in progress")
        if self._live_in.get("load"):
            return self._measured("load", s.load_timeout, "a checkpoint is being loaded")
        if self._live_in.get("eval"):
            return s.hang_timeout, "an evaluation is in progress (watchdog.hang_timeout)"
        return None

    def _measured(self, phase: str, bound: float, what: str) -> tuple[float, str]:
        """A save's or load's timeout from the longest this run measured (this attempt's, or an earlier one's): a save
        that took 2 s is hung long before the configured 15 minutes; the configured bound until one has ended, and
        never above it. An attempt begins with its one load, so only earlier attempts can measure it."""
        took = max(self.longest.get(phase, -1.0), self.earlier.get(phase, -1.0))
        if took < 0:
            return bound, f"{what} (watchdog.{phase}_timeout: no {phase} of this run has ended yet)"
        timeout = min(bound, max(PHASE_FLOOR_S, PHASE_MULTIPLE * took))
        return timeout, (f"{what} ({PHASE_MULTIPLE:g} x the longest {phase} of this run, {took:.3g} s, at least"
                         f" {PHASE_FLOOR_S:g} s, at most watchdog.{phase}_timeout {bound:g} s)")

    def _step_timeout(self) -> tuple[float, str]:
        s = self.settings
        sample = self.ranks[:: max(1, self.world // TIMEOUT_SAMPLE)]
        done = sorted(r.steps_done for r in sample)
        if not done or done[len(done) // 2] < WARMUP_STEPS:
            return s.hang_timeout, "warm-up: fewer than 5 steps observed (watchdog.hang_timeout)"
        recent = [t for r in sample for t in list(r.step_times)[-s.window :]]
        median = statistics.median(recent) if recent else s.hang_timeout
        derived = min(s.hang_timeout, max(HANG_FLOOR_S, HANG_MULTIPLE * median))
        return derived, f"{HANG_MULTIPLE:g} x the median step time {median:.3g} s (at most watchdog.hang_timeout)"

    def check(self, now: float) -> Verdict | None:
        return self.check_hang(now) or self.check_straggler()

    def check_hang(self, now: float) -> Verdict | None:
        if self.last_progress is None:
            return self._silent_before_training(now)
        timeout, why = self.hang_timeout()
        stalled = now - self.last_progress
        if stalled < timeout:
            return self._stopped_in_a_long_phase(now, stalled)
        culprits, reason, stopped = self._hang_culprits(now)
        return self._hang(now, timeout, why, stalled, culprits, reason, stopped)

    def _stopped_in_a_long_phase(self, now: float, stalled: float) -> Verdict | None:
        """A rank that cannot finish the save (or load, or evaluation) its peers wait for: judged at the step's timeout.

        The long bound is for a save that is slow, not for a process that
        stopped in it: a stopped process, or a liveness beat silent for the
        step's timeout while its peers beat on, will never finish, and
        waiting out watchdog.save_timeout (15 minutes) idles every rank.
        """
        if self._phase_timeout() is None:
            return None
        timeout, why = self._step_timeout()
        if stalled < timeout:
            return None
        quiet = max(timeout, LIVENESS_TIMEOUT_S)  # a save may hold the interpreter for seconds: a beat silent that long
        silent = [r for r in self.ranks if r.process != GONE
                  and (r.process == "stopped" or (r.last_beat is not None and now - r.last_beat >= quiet))]
        if not silent or len(silent) == self.world:
            return None
        silent.sort(key=lambda r: (r.last_beat or 0.0, r.rank))
        first = silent[0]
        state = "process stopped" if first.process == "stopped" else "no liveness beat"
        reason = (f"{state}, last heartbeat {now - (first.last_beat or now):.1f} s ago in phase {first.phase} at step"
                  f" {first.step}, while its peers beat on")
        return self._hang(now, timeout, f"{why}; a rank that stopped in a {first.phase} never finishes it", stalled,
                          silent, reason, True)

    def _silent_before_training(self, now: float) -> Verdict | None:
        """No phases yet (start-up, or a script that reports none): only a rank gone silent is a hang."""
        timeout = self.settings.hang_timeout
        silent = [
            r for r in self.ranks if r.last_beat is not None and now - r.last_beat > timeout and r.process != GONE
        ]
        if not silent or len(silent) == self.world:
            return None
        silent.sort(key=lambda r: (r.last_beat or 0.0, r.rank))
        stalled = now - (silent[0].last_beat or now)
        state = "process stopped" if silent[0].process == "stopped" else "no liveness beat"
        reason = f"{state} for {stalled:.1f} s before any training step, while its peers beat on"
        return self._hang(now, timeout, "no training step yet (watchdog.hang_timeout)", stalled, silent, reason, True)

    def _hang(
        self, now: float, timeout: float, why: str, stalled: float, culprits: list[RankState], reason: str,
        stopped: bool,
    ) -> Verdict:
        """A stopped process, or one whose liveness beat stopped, is its node's evidence; a live rank outside the
        collective or behind its peers is ambiguous (the script's data, a deadlock of its own, or the node): the
        restart policy waits to see whether it follows the rank or the node (runtime/recovery/policy.py)."""
        victims, summary = self._victims(culprits, lambda r: f"waiting in {r.phase} at step {r.step}")
        evidence = {
            "hang_timeout_s": round(timeout, 3),
            "timeout_rule": why,
            "no_progress_s": round(stalled, 3),
            "ranks": {str(r.rank): self._rank_facts(r, now) for r in sorted(culprits + victims, key=lambda r: r.rank)},
            **summary,
        }
        self._add_gpu_evidence(evidence, culprits)
        if culprits and not stopped:
            evidence["signature"] = f"hang in {culprits[0].phase} at step {culprits[0].step}"
        if culprits:
            first = culprits[0]
            message = (
                f"hang: no progress for {stalled:.1f} s (timeout {timeout:.1f} s); culprit rank {first.rank} on"
                f" {first.node}: {reason}" + (f" (+{len(culprits) - 1} more)" if len(culprits) > 1 else "")
            )
        else:
            message = (
                f"hang: no progress for {stalled:.1f} s (timeout {timeout:.1f} s) on any rank; no single culprit"
                " (every rank waits in the same phase)"
            )
        return Verdict(
            False,
            int(ExitCode.HANG),
            message,
            [self._entry(r, reason, "stopped" if stopped else "stalled") for r in culprits],
            evidence,
            [self._entry(r, f"waiting in {r.phase} at step {r.step}") for r in victims],
            fault=FAULT_NODE if stopped and culprits else FAULT_AMBIGUOUS,
        )

    def _hang_culprits(self, now: float) -> tuple[list[RankState], str, bool]:
        """The ranks a hang is on, why, and whether their processes (or liveness beats) stopped."""
        silent = [
            r
            for r in self.ranks
            if r.process == "stopped"
            or (r.last_beat is not None and now - r.last_beat > LIVENESS_TIMEOUT_S and r.process != GONE)
        ]
        if silent and len(silent) < self.world:
            silent.sort(key=lambda r: (r.last_beat or 0.0, r.rank))
            first = silent[0]
            state = "process stopped" if first.process == "stopped" else "no liveness beat"
            age = now - (first.last_beat or now)
            return silent, f"{state}, last heartbeat {age:.1f} s ago in phase {first.phase} at step {first.step}", True
        waiting = [r for r in self.ranks if r.phase in WAITING_PHASES]
        outside = [r for r in self.ranks if r.phase not in WAITING_PHASES]
        if waiting and outside and len(outside) < len(waiting):
            outside.sort(key=lambda r: (r.phase_since or 0.0, r.rank))
            first = outside[0]
            return outside, (
                f"never entered the collective its peers wait in: in phase {first.phase} at step {first.step}"
                f" for {now - (first.phase_since or now):.1f} s"
            ), False
        steps = [r.step for r in self.ranks]
        lowest, highest = min(steps), max(steps)
        if lowest < highest:
            behind = [r for r in self.ranks if r.step == lowest]
            if len(behind) < self.world:
                return behind, f"behind its peers: at step {lowest} in phase {behind[0].phase}, peers at step {highest}", False
        return [], "", False

    def check_straggler(self) -> Verdict | None:
        """A rank that loses a steady share of its time against its peers (runtime/controller/straggler.py): on every step for
        PERSIST_STEPS, or in stalls that recur over straggler.RECUR_WINDOWS windows. Judged once for each new step
        every rank reported (the columns): nothing else changes what the rule says."""
        if self.world < 2 or self.columns.made == self._judged:
            return None  # one rank alone has nobody waiting for it; no new step since the last judgment
        self._judged = self.columns.made
        s = self.settings
        table = self.columns.table(straggler.RECUR_WINDOWS * s.window)  # one table: both rules read it
        if table is None or len(table.steps) < s.window:
            self._suspect = None
            return None  # a full window of steps every rank reported, after the attempt's first
        limits = straggler.limits(s)
        return self._steady(table, limits) or self._recurring(table, limits)

    def _steady(self, table: straggler.Excesses, limits: straggler.Limits) -> Verdict | None:
        """The trimmed rule over the last window, named at each step since `since` and confirmed over them."""
        window = self.settings.window
        last = len(table.steps) - window
        steps = table.steps[last:]
        found = table.found(last, trimmed=straggler.trim(window))
        worst = straggler.slowest(found, limits, self._node_ids)
        if worst is None:
            self._suspect = None
            return None
        if self._suspect is None or self._suspect[0] != worst.rank:
            self._suspect = (worst.rank, straggler.named_from(table, worst.rank, window, limits))
        since = self._suspect[1]
        newer = [step for step in steps if step > since]
        if len(newer) < min(PERSIST_STEPS, window):
            return None
        going_on = straggler.confirmed(table, worst.rank, since, limits, window)
        if going_on is None:
            self._suspect = (worst.rank, steps[-1])  # not losing since: a new span must show it
            return None
        why = straggler.describe(worst, window, going_on, len(newer), limits, _peers_lost(found, worst))
        return self._straggler_verdict(worst, found, steps, why, {
            "rule": "steady",
            "trimmed_steps": straggler.trim(window),
            "since_step": since,
            "due_step": newer[min(PERSIST_STEPS, window) - 1],  # where the rule held: the verdict lands with the node's report
            "lost_since_s": round(going_on.lost_s, 6),
        })

    def _recurring(self, table: straggler.Excesses, limits: straggler.Limits) -> Verdict | None:
        """Stalls on some steps, every step counted, over the last RECUR_WINDOWS windows."""
        window = self.settings.window
        worst = straggler.recurring(table, window, limits, self._node_ids)
        if worst is None:
            return None
        start = len(table.steps) - straggler.RECUR_WINDOWS * window
        steps = table.steps[start:]
        found = table.found(start)
        stalls = table.stalls(worst.rank, start)
        why = straggler.describe_recurring(worst, window, stalls, limits, _peers_lost(found, worst))
        return self._straggler_verdict(worst, found, steps, why, {
            "rule": "recurring", "trimmed_steps": 0, "windows": straggler.RECUR_WINDOWS, "stalled_steps": stalls,
            "since_step": steps[0], "due_step": steps[-1]})

    def _straggler_verdict(self, worst: straggler.Standing, found: straggler.Found, steps: list[int], why: str,
                           rule: dict[str, Any]) -> Verdict:
        """The evidence names the culprit and the EVIDENCE_RANKS - 1 ranks that lost the most besides it (every rank
        of a small world; the median of all of them at any size): a 100,000-rank table is no evidence anyone reads."""
        s = self.settings
        culprit = self.ranks[worst.rank]
        named = [worst.rank] + [int(r) for r in np.argsort(-found.lost_s, kind="stable")[:EVIDENCE_RANKS] if r != worst.rank]
        named = sorted(named[:EVIDENCE_RANKS])
        evidence: dict[str, Any] = {
            "straggler_factor": s.straggler_factor,
            "straggler_min_compute_s": s.straggler_min_compute_s,
            "straggler_min_lost_s": s.straggler_min_lost_s,
            "window": s.window,
            **rule,
            "ratio": round(worst.ratio, 3),
            "lost_s": {str(r): round(float(found.lost_s[r]), 6) for r in named},
            "peers_compute_s": {str(r): round(float(found.peers_s[r]), 6) for r in named},
            "lost_s_median": round(float(np.median(found.lost_s)), 6),
            "culprit_compute_s": [[step, round(self.columns.value(worst.rank, step), 6)] for step in steps],
            "step": culprit.step,
        }
        self._add_gpu_evidence(evidence, [culprit])
        victims, summary = self._victims([culprit], lambda r: "slowed by the straggler")
        evidence.update(summary)
        return Verdict(
            False,
            int(ExitCode.STRAGGLER),
            f"straggler: rank {worst.rank} on {culprit.node}: {why}",
            [self._entry(culprit, why, "slow")],
            evidence,
            [self._entry(r, "slowed by the straggler") for r in victims],
            fault=FAULT_NODE,
        )

    # --- helpers ---------------------------------------------------------------------
    def _victims(self, culprits: list[RankState], said: Callable[[RankState], str]
                 ) -> tuple[list[RankState], dict[str, Any]]:
        """The victims a verdict names and the evidence's count of all of them (blame.name_victims: the culprits'
        nodes' other ranks first)."""
        blamed = {c.rank for c in culprits}
        nodes = {c.node for c in culprits}
        ranks = self.ranks
        named, counted = name_victims([r.rank for r in ranks if r.rank not in blamed], lambda r: ranks[r].node in nodes,
                                      lambda r: said(ranks[r]))
        return [ranks[r] for r in named], counted

    def _entry(self, r: RankState, reason: str, evidence: str = "") -> dict[str, Any]:
        entry: dict[str, Any] = {"rank": r.rank, "host": r.node, "gpu": r.gpu, "reason": reason}
        if evidence:
            entry["evidence"] = evidence  # a culprit's: a word of rundir/verdict.EVIDENCE
        return entry

    def _rank_facts(self, r: RankState, now: float) -> dict[str, Any]:
        return {
            "host": r.node,
            "pid": r.pid,
            "phase": r.phase,
            "step": r.step,
            "process": r.process,
            "last_beat_age_s": None if r.last_beat is None else round(now - r.last_beat, 3),
            "in_phase_s": None if r.phase_since is None else round(now - r.phase_since, 3),
        }

    def _add_gpu_evidence(self, evidence: dict[str, Any], culprits: list[RankState]) -> None:
        found = {}
        for r in culprits:
            sample = self.gpu_samples.get(r.node, {})
            gpu = sample.get(str(r.gpu)) if r.gpu is not None else None
            if gpu is not None:
                found[str(r.rank)] = gpu
        if found:
            evidence["gpu"] = found


def _peers_lost(found: straggler.Found, worst: straggler.Standing) -> float:
    """The most any peer of the straggler lost a step: the verdict shows that nobody else was slow."""
    others = np.ones(len(found), dtype=bool)
    others[worst.rank] = False
    return found.most_lost(others)
