"""The watchdog's and the end-of-attempt judge's rules, on made-up timelines (pure: no processes).

The multi-process behaviour (real aggregators, real signals) is in
test_detection.py; here each rule is pinned with exact numbers: which rank
is blamed, which are victims, and after how long.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.runjson import WatchdogRecord as Settings
from clusterctl.runtime.controller.blame import Facts, blame_end, parse_srun_lines
from clusterctl.runtime.controller.watchdog import HANG_FLOOR_S, HANG_MULTIPLE, PHASE_FLOOR_S, PHASE_MULTIPLE, Watchdog

HOSTS = ["n1", "n2"]


def training(world: int = 4, steps: int = 30, step_s: float = 1.0, compute: dict[int, float] | None = None,
             settings: Settings | None = None, noise: float = 0.0, seed: int = 0) -> tuple[Watchdog, float]:
    """A watchdog fed `steps` synchronous steps of every rank; returns it and the time after the last step."""
    wd = Watchdog(world, HOSTS, max(1, world // len(HOSTS)), settings or Settings(hang_timeout=120, straggler_factor=1.25, window=20))
    rng = random.Random(seed)
    t = 1000.0
    for step in range(steps):
        for rank in range(world):
            wd.observe({"kind": "phase", "rank": rank, "step": step, "phase": "forward", "pid": 100 + rank, "gpu": rank % 2}, t)
        t += step_s * 0.8
        for rank in range(world):
            wd.observe({"kind": "phase", "rank": rank, "step": step, "phase": "collective"}, t)
        t += step_s * 0.2
        for rank in range(world):
            c = (compute or {}).get(rank, 0.8 * step_s) * (1 + rng.uniform(-noise, noise))
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": step_s, "compute_s": c}, t)
            wd.observe({"kind": "alive", "rank": rank}, t)
    return wd, t


def step_all(wd: Watchdog, step: int, t: float, step_s: float, compute: dict[int, float], default: float) -> None:
    """Every rank of 4 reports `step` at `t`: its compute time from `compute`, else `default`."""
    for rank in range(4):
        wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": step_s,
                    "compute_s": compute.get(rank, default)}, t)


def test_hang_timeout_is_derived_from_the_step_time_after_warmup() -> None:
    wd, _ = training(steps=3)
    assert wd.hang_timeout()[0] == 120  # warm-up: the configured bound
    wd, _ = training(steps=10, step_s=1.0)
    assert wd.hang_timeout()[0] == pytest.approx(HANG_MULTIPLE * 1.0)
    wd, _ = training(steps=10, step_s=0.1)
    assert wd.hang_timeout()[0] == HANG_FLOOR_S
    wd, _ = training(steps=10, step_s=60.0)
    assert wd.hang_timeout()[0] == 120  # bounded above by watchdog.hang_timeout


def test_a_stopped_rank_is_the_culprit_and_its_waiting_peers_are_victims() -> None:
    wd, t = training(steps=10)
    # Step 10: rank 2 is stopped in its forward; the others finish theirs and wait in the collective.
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 10, "phase": "forward"}, t)
    for rank in (0, 1, 3):
        wd.observe({"kind": "phase", "rank": rank, "step": 10, "phase": "collective"}, t + 0.8)
    for second in range(1, 7):
        for rank in (0, 1, 3):
            wd.observe({"kind": "alive", "rank": rank}, t + second)
    assert wd.check(t + 0.8 + 4.9) is None  # 5 s timeout (5 x 1 s steps) not reached
    finding = wd.check(t + 0.8 + 5.1)
    assert finding is not None and finding.code == ExitCode.HANG
    assert [c["rank"] for c in finding.culprits] == [2]
    assert finding.culprits[0]["host"] == "n2" and finding.culprits[0]["gpu"] == 0
    assert "no liveness beat" in finding.culprits[0]["reason"]
    assert sorted(v["rank"] for v in finding.victims) == [0, 1, 3]
    assert finding.evidence["hang_timeout_s"] == 5.0
    assert finding.evidence["ranks"]["2"]["phase"] == "forward"


def test_the_aggregators_stopped_state_names_the_culprit_before_its_beats_age() -> None:
    wd, t = training(steps=10)
    for rank in (0, 1, 2, 3):
        wd.observe({"kind": "phase", "rank": rank, "step": 10, "phase": "collective" if rank != 1 else "backward"}, t)
    for second in range(1, 7):
        for rank in (0, 2, 3):
            wd.observe({"kind": "alive", "rank": rank}, t + second)
    wd.observe_process(1, "stopped", t + 1)
    finding = wd.check(t + 5.5)
    assert finding is not None and [c["rank"] for c in finding.culprits] == [1]
    assert "process stopped" in finding.culprits[0]["reason"]
    assert (finding.fault, finding.culprits[0]["evidence"]) == ("node", "stopped")  # its node pays at once


def test_a_rank_busy_outside_the_collective_is_the_culprit_of_a_hang() -> None:
    wd, t = training(steps=10)
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 10, "phase": "forward"}, t)
    for rank in (0, 2, 3):
        wd.observe({"kind": "phase", "rank": rank, "step": 10, "phase": "collective"}, t + 0.5)
    for second in range(1, 8):  # everybody's liveness beat goes on: rank 1 is alive but stuck in its forward
        for rank in range(4):
            wd.observe({"kind": "alive", "rank": rank}, t + second)
    finding = wd.check(t + 6)
    assert finding is not None and [c["rank"] for c in finding.culprits] == [1]
    assert "never entered the collective" in finding.culprits[0]["reason"]
    # Alive but elsewhere: the script's own deadlock or its data as much as the node; nobody pays the first time.
    assert (finding.fault, finding.culprits[0]["evidence"]) == ("ambiguous", "stalled")
    assert finding.evidence["signature"] == "hang in forward at step 10"


def test_saves_and_evaluations_have_their_own_timeouts() -> None:
    settings = Settings(hang_timeout=30, save_timeout=60, straggler_factor=1.25, window=20)
    wd, t = training(steps=10, settings=settings)
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "save"}, t)
    for second in range(1, 70):
        for rank in range(4):
            wd.observe({"kind": "alive", "rank": rank}, t + second)
    assert wd.check(t + 59) is None
    assert wd.check(t + 61) is not None
    wd, t = training(steps=10, settings=settings)
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "eval"}, t)
    assert wd.check(t + 29) is None
    assert wd.check(t + 31).code == ExitCode.HANG


@pytest.mark.parametrize("how", ["stopped", "silent"])
def test_a_rank_stopped_in_a_save_is_judged_at_the_steps_timeout_not_the_saves(how: str) -> None:
    settings = Settings(hang_timeout=30, save_timeout=900, straggler_factor=1.25, window=20)
    wd, t = training(steps=10, settings=settings)  # 1 s steps: the step's timeout is 5 s
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "save"}, t)
    for rank in (0, 1, 3):  # they finish their shards and wait for rank 2's
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "collective"}, t + 0.2)
    for second in range(1, 10):
        for rank in (0, 1, 3):
            wd.observe({"kind": "alive", "rank": rank}, t + second)
    if how == "stopped":
        wd.observe_process(2, "stopped", t + 0.5)
    assert wd.hang_timeout()[0] == 900  # rank 2's save is in force: it has not ended, its peers' 0.2 s is no measure
    assert wd.check(t + 4.9) is None
    finding = wd.check(t + 5.3)
    assert finding is not None and finding.code == ExitCode.HANG, finding
    assert [c["rank"] for c in finding.culprits] == [2] and finding.fault == "node"
    assert sorted(v["rank"] for v in finding.victims) == [0, 1, 3]
    assert "in phase save at step 9" in finding.culprits[0]["reason"]
    assert finding.evidence["hang_timeout_s"] == 5.0


def test_a_save_that_outlasts_this_attempts_saves_by_far_is_a_hang_long_before_the_configured_bound() -> None:
    """Saves of 2 s, then one in which every rank beats on but none gets out: a hang at PHASE_MULTIPLE x 2 s (at
    least PHASE_FLOOR_S), not after watchdog.save_timeout's 15 minutes; the first save of an attempt has the bound."""
    settings = Settings(hang_timeout=30, save_timeout=900, straggler_factor=1.25, window=20)
    wd, t = training(steps=10, settings=settings)
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "save"}, t)
    assert wd.hang_timeout()[0] == 900  # no save measured yet
    assert "no save of this run has ended yet" in wd.hang_timeout()[1]
    for rank in (1, 2, 3):  # rank 0 writes what its peers do not: they are out in 0.1 s, which is no save's length
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "collective"}, t + 0.1)
    assert wd.hang_timeout()[0] == 900
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 10, "phase": "forward"}, t + 2.0 + 0.1 * rank)
    t += 3
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 19, "phase": "save"}, t)
    for second in range(1, 200):
        for rank in range(4):
            wd.observe({"kind": "alive", "rank": rank}, t + second)  # a thread beats on: the ranks live, stuck
    bound, why = wd.hang_timeout()
    assert bound == max(PHASE_FLOOR_S, PHASE_MULTIPLE * 2.0)  # from the first rank in to rank 0 out
    assert "the longest save of this run, 2 s" in why
    assert wd.check(t + bound - 1) is None
    finding = wd.check(t + bound + 1)
    assert finding is not None and finding.code == ExitCode.HANG


def test_a_stops_save_ends_when_the_ranks_loops_close() -> None:
    """A stop request's save is the ranks' last phase: they close their loops and exit from it, and it is measured
    (rank 1 closing first leaves the save under way until rank 0's is done)."""
    wd, t = training(world=2, steps=10)
    for rank in range(2):
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "save"}, t)
    wd.observe({"kind": "closed", "rank": 1}, t + 0.5)
    assert "save" not in wd.longest
    wd.observe({"kind": "closed", "rank": 0}, t + 2.5)
    assert wd.longest == {"save": 2.5}


def test_an_attempts_one_load_is_judged_by_the_runs_earlier_durable_loads(tmp_path: Path) -> None:
    """The load an attempt begins with is its only one: the bound comes from the earlier attempts' phase-times.json,
    their loads of a committed checkpoint only (a 0.1 s load from host memory is no measure of one from disk)."""
    from clusterctl.rundir import phasetimes

    for number, longest, source in ((1, {"save": 3.0}, None), (2, {"load": 0.1}, "memory"),
                                    (3, {"save": 2.0, "load": 9.0}, "durable"), (4, {"save": 500.0}, None)):
        (tmp_path / f"attempt-{number}").mkdir()
        phasetimes.write(tmp_path / f"attempt-{number}", longest, source)
    earlier = phasetimes.run_longest(tmp_path, 4)  # attempt 4's own is not earlier
    assert earlier == {"save": 3.0, "load": 9.0}
    settings = Settings(hang_timeout=30, load_timeout=900, save_timeout=900, straggler_factor=1.25, window=20)
    wd = Watchdog(4, HOSTS, 2, settings, earlier)
    t = 1000.0
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": -1, "phase": "load", "pid": 100 + rank}, t)
    for second in range(1, 80):
        for rank in range(4):
            wd.observe({"kind": "alive", "rank": rank}, t + second)  # beating, and no rank gets out of the load
    bound, why = wd.hang_timeout()
    assert bound == max(PHASE_FLOOR_S, PHASE_MULTIPLE * 9.0) and "the longest load of this run, 9 s" in why
    assert wd.check(t + bound - 1) is None
    finding = wd.check(t + bound + 1)
    assert finding is not None and finding.code == ExitCode.HANG
    fresh = Watchdog(4, HOSTS, 2, settings, phasetimes.run_longest(tmp_path, 3))  # only a memory load before it
    for rank in range(4):
        fresh.observe({"kind": "phase", "rank": rank, "step": -1, "phase": "load"}, t)
    assert fresh.hang_timeout()[0] == 900


def test_a_slow_save_whose_ranks_all_beat_waits_for_the_saves_timeout() -> None:
    settings = Settings(hang_timeout=30, save_timeout=60, straggler_factor=1.25, window=20)
    wd, t = training(steps=10, settings=settings)
    for rank in range(4):
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "save"}, t)
    for rank in (0, 1, 3):
        wd.observe({"kind": "phase", "rank": rank, "step": 9, "phase": "collective"}, t + 0.2)
    for second in range(1, 70):
        for rank in range(4):
            if rank != 2 or second % 4 == 0:  # rank 2's interpreter is busy writing: a beat every 4 s
                wd.observe({"kind": "alive", "rank": rank}, t + second)
    assert wd.check(t + 59) is None
    assert wd.check(t + 61) is not None


@pytest.mark.parametrize("factor, within", [(1.5, 30), (3.0, 30)])
def test_a_straggler_is_named_from_its_compute_time(factor: float, within: int) -> None:
    wd, t = training(steps=30, noise=0.05)
    assert wd.check(t) is None
    rng = random.Random(1)
    for extra in range(within):
        step = 30 + extra
        t += 1.0 * factor
        for rank in range(4):
            c = 0.8 * (factor if rank == 3 else 1.0) * (1 + rng.uniform(-0.05, 0.05))
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": factor, "compute_s": c}, t)
        finding = wd.check(t)
        if finding is not None:
            break
    assert finding is not None and finding.code == ExitCode.STRAGGLER, f"not named within {within} steps"
    assert [c["rank"] for c in finding.culprits] == [3]
    assert sorted(v["rank"] for v in finding.victims) == [0, 1, 2]
    assert finding.evidence["ratio"] > 1.25
    assert (finding.fault, finding.culprits[0]["evidence"]) == ("node", "slow")
    assert extra + 1 <= 16  # the median of a 20-step window turns after 11 slow steps, then 5 steps to persist


def test_a_rank_slower_than_its_own_past_but_not_than_its_peers_is_no_straggler() -> None:
    """A script's later phase, or a restart's first steps, change a rank's pace: its own past is no baseline."""
    wd, t = training(world=1, steps=40)
    for step in range(40, 70):
        t += 2
        wd.observe({"kind": "step", "rank": 0, "step": step, "phase": "collective", "step_s": 2, "compute_s": 1.6}, t)
        assert wd.check(t) is None, step


def test_an_attempts_first_window_is_not_judged_a_restarts_uneven_start_is_no_straggler() -> None:
    """After a warm restart one healthy rank ran 1.3-1.4x its peers for most of a window (the soak on the lab);
    the attempt's first `window` steps are left out, a rank slow after them is still named."""
    slow_start = {rank: 0.8 * (1.5 if rank == 3 else 1.0) for rank in range(4)}
    wd, t = training(steps=30, compute=slow_start)  # the first window and 10 steps more: rank 3 at 1.5x
    for step in range(30, 60):
        t += 1.0
        for rank in range(4):
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 1.0, "compute_s": 0.8}, t)
        assert wd.check(t) is None, step
    for step in range(60, 90):
        t += 1.5
        for rank in range(4):
            c = 1.2 if rank == 3 else 0.8
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 1.5, "compute_s": c}, t)
        finding = wd.check(t)
        if finding is not None:
            break
    assert finding is not None and [c["rank"] for c in finding.culprits] == [3]


def test_tiny_steps_with_large_ratios_are_timing_jitter_not_a_straggler() -> None:
    """The field's case: a ~0.35 ms compute step that takes 1.45 ms on one rank is 4x, and lost nothing worth a node."""
    wd, t = training(steps=30, step_s=0.016, compute={r: 0.00035 for r in range(4)})
    for step in range(30, 90):
        t += 0.016
        for rank in range(4):
            c = 0.00145 if rank == 1 else 0.00035
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 0.016, "compute_s": c}, t)
        assert wd.check(t) is None, step


def test_a_rank_that_stalls_one_step_in_four_is_a_straggler_and_one_spike_is_not() -> None:
    settings = Settings(hang_timeout=120, straggler_factor=1.25, window=20)
    wd, t = training(steps=30, settings=settings)
    for step in range(30, 36):  # one long garbage collection on rank 0: a spike
        t += 1.0
        for rank in range(4):
            c = 3.0 if (rank == 0 and step == 31) else 0.8
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 1.0, "compute_s": c}, t)
        assert wd.check(t) is None, step
    finding = None
    for step in range(36, 80):  # rank 2 stalls 1.6 s every fourth step: three steps in four look healthy
        t += 1.0
        for rank in range(4):
            c = 2.4 if (rank == 2 and step % 4 == 0) else 0.8
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 1.0, "compute_s": c}, t)
        finding = finding or wd.check(t)
    assert finding is not None and finding.code == ExitCode.STRAGGLER
    assert [c["rank"] for c in finding.culprits] == [2]


def test_a_rank_stopped_100ms_in_every_300ms_on_short_steps_is_a_recurring_straggler_and_two_spikes_are_not() -> None:
    """The field's case: stalls on one step in eight, two of a 20-step window, which the trim leaves out as spikes;
    the rank loses a third of its time. Two 0.5 s spikes ten steps apart on another rank name nobody."""
    wd, t = training(steps=30, step_s=0.03, compute={r: 0.02 for r in range(4)}, noise=0.05)
    rng = random.Random(3)
    finding = None
    for step in range(30, 200):
        t += 0.03
        for rank in range(4):
            c = 0.02 * (1 + rng.uniform(-0.05, 0.05))
            c += 0.1 if (rank == 2 and step >= 100 and step % 8 == 0) else 0.0
            c += 0.5 if (rank == 1 and step in (50, 60)) else 0.0
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 0.03, "compute_s": c}, t)
        finding = wd.check(t)
        if step < 100:
            assert finding is None, step
        if finding is not None:
            break
    assert finding is not None and finding.code == ExitCode.STRAGGLER
    assert [c["rank"] for c in finding.culprits] == [2]
    assert finding.evidence["rule"] == "recurring" and finding.evidence["stalled_steps"] >= 7
    assert step < 100 + 3 * 20 + 10  # three windows of its stalls, and a few steps
    assert "every step counted, over the last 3 windows of 20 steps" in finding.message


def test_no_false_verdict_over_a_noisy_clean_run_with_saves_and_evaluations() -> None:
    settings = Settings(hang_timeout=120, save_timeout=900, straggler_factor=1.25, window=20)
    wd = Watchdog(4, HOSTS, 2, settings)
    rng = random.Random(7)
    t = 0.0
    for step in range(400):
        for rank in range(4):
            wd.observe({"kind": "phase", "rank": rank, "step": step, "phase": "forward"}, t)
        t += rng.uniform(0.7, 1.3)
        for rank in range(4):
            c = rng.uniform(0.6, 1.0)
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 1.0, "compute_s": c}, t)
        if step % 50 == 49:
            for rank in range(4):
                wd.observe({"kind": "phase", "rank": rank, "step": step, "phase": "save"}, t)
            t += 20  # a save far longer than the derived hang timeout
            assert wd.check(t) is None
        if step % 25 == 24:
            for rank in range(4):
                wd.observe({"kind": "phase", "rank": rank, "step": step, "phase": "eval"}, t)
            t += 15
            assert wd.check(t) is None
        assert wd.check(t) is None, step


def test_a_plain_script_without_phases_is_never_judged_hung() -> None:
    wd = Watchdog(2, ["n1"], 2, Settings())
    for second in range(1000):
        wd.observe({"kind": "alive", "rank": 0}, second)
    assert wd.check(1000) is None


# --- the end-of-attempt judge --------------------------------------------------------

KILLED = """srun: error: n2: task 2: Killed
srun: launch/slurm: _step_signal: Terminating StepId=1.0
0: slurmstepd-n1: error: *** STEP 1.0 ON n1 CANCELLED AT 2026-11-30T21:59:25 ***
srun: error: n2: task 3: Terminated
srun: error: n1: tasks 0-1: Terminated
srun: Force Terminated StepId=1.0""".splitlines()


def test_srun_lines_are_read_in_order_with_the_terminate_marker() -> None:
    ends = parse_srun_lines(KILLED)
    assert [(e.node, e.ranks, e.what, e.after_terminate) for e in ends] == [
        ("n2", (2,), "Killed", False),
        ("n2", (3,), "Terminated", True),
        ("n1", (0, 1), "Terminated", True),
    ]


def test_a_killed_rank_is_the_culprit_not_the_ranks_that_saw_it_go() -> None:
    facts = Facts(
        world=4,
        hosts=HOSTS,
        gpus_per_node=2,
        gpus={0: 0, 1: 1, 2: 0, 3: 1},
        errors={
            0: "Traceback (most recent call last):\n  ...\nRuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:23456",
            1: "RuntimeError: Connection closed by peer",
            3: "DistBackendError: NCCL communicator was aborted on rank 3",
        },
        srun=parse_srun_lines(KILLED),
        deaths={2: 10.0, 3: 10.05, 0: 10.06, 1: 10.07},
    )
    blame = blame_end(facts)
    assert blame is not None and blame.code == ExitCode.SCRIPT_FAILED
    assert [c["rank"] for c in blame.culprits] == [2]
    assert blame.culprits[0] == {"rank": 2, "host": "n2", "gpu": 0, "reason": "killed by a signal (Killed) before any peer failed",
                                 "evidence": "signal"}
    assert blame.fault == "node"
    assert sorted(v["rank"] for v in blame.victims) == [0, 1, 3]
    assert blame.evidence["how"] == "Killed"
    assert blame.message.startswith("rank 2 on n2 failed")


def test_a_rank_killed_inside_a_container_or_shell_is_reported_as_the_signal() -> None:
    """A process a signal ended under bash or a container runtime exits 128 + N: the blame says which signal."""
    lines = """srun: error: n2: task 2: Exited with exit code 137
srun: launch/slurm: _step_signal: Terminating StepId=5.0
srun: error: n1: tasks 0-1: Terminated""".splitlines()
    blame = blame_end(Facts(world=4, hosts=HOSTS, gpus_per_node=2, srun=parse_srun_lines(lines)))
    assert [c["rank"] for c in blame.culprits] == [2]
    assert blame.culprits[0]["reason"] == ("exited with code 137 (128 + SIGKILL: a signal, as a shell or container"
                                           " reports it) on its own")


def test_a_rank_whose_script_raised_is_the_culprit_even_if_a_victim_exited_first() -> None:
    lines = """srun: error: n1: task 0: Exited with exit code 1
srun: error: n1: task 1: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=5.0
srun: error: n2: tasks 2-3: Terminated""".splitlines()
    facts = Facts(
        world=4, hosts=HOSTS, gpus_per_node=2,
        errors={0: "RuntimeError: Connection reset by peer", 1: "Traceback ...\nValueError: bad batch shape (3, 7)"},
        srun=parse_srun_lines(lines),
    )
    blame = blame_end(facts)
    assert [c["rank"] for c in blame.culprits] == [1]
    assert "ValueError: bad batch shape" in blame.culprits[0]["reason"]
    assert sorted(v["rank"] for v in blame.victims) == [0, 2, 3]


def test_a_node_whose_aggregator_and_ranks_vanished_is_lost() -> None:
    lines = """srun: error: n2: tasks 2-3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=1.0
srun: error: n1: tasks 0-1: Terminated""".splitlines()
    facts = Facts(world=4, hosts=HOSTS, gpus_per_node=2, srun=parse_srun_lines(lines), lost_nodes={"n2": 5.0})
    blame = blame_end(facts)
    assert blame.code == ExitCode.NODE_LOST
    assert [(c["rank"], c["host"]) for c in blame.culprits] == [(2, "n2"), (3, "n2")]
    assert sorted(v["rank"] for v in blame.victims) == [0, 1]


def test_an_aggregator_gone_while_its_ranks_live_is_not_a_lost_node() -> None:
    lines = ["srun: error: n1: task 0: Killed"]
    facts = Facts(world=4, hosts=HOSTS, gpus_per_node=2, srun=parse_srun_lines(lines), lost_nodes={"n2": 5.0})
    blame = blame_end(facts)
    assert blame.code == ExitCode.SCRIPT_FAILED and [c["rank"] for c in blame.culprits] == [0]


def test_ranks_that_stopped_on_request_are_no_failure() -> None:
    lines = ["srun: error: n1: tasks 0-1: Exited with exit code 85", "srun: error: n2: tasks 2-3: Exited with exit code 85"]
    assert blame_end(Facts(world=4, hosts=HOSTS, gpus_per_node=2, srun=parse_srun_lines(lines))) is None


def test_a_rank_silent_before_the_first_step_is_a_hang_after_the_configured_timeout() -> None:
    wd = Watchdog(4, HOSTS, 2, Settings(hang_timeout=60))
    for second in range(200):  # start-up: liveness only (loading data, calibrating); rank 1 stops at 10 s
        for rank in range(4):
            if rank != 1 or second < 10:
                wd.observe({"kind": "alive", "rank": rank, "pid": 10 + rank}, second)
        finding = wd.check(second + 0.5)
        if finding is not None:
            break
    assert finding is not None and 69 <= second <= 71
    assert [c["rank"] for c in finding.culprits] == [1] and "before any training step" in finding.culprits[0]["reason"]
    assert sorted(v["rank"] for v in finding.victims) == [0, 2, 3]


def test_a_lost_phase_message_is_made_good_by_the_next_liveness_beat() -> None:
    wd, t = training(steps=10)
    # Every rank enters a long evaluation, but the `eval` datagrams are lost; the liveness beats say eval.
    for second in range(1, 20):
        for rank in range(4):
            wd.observe({"kind": "alive", "rank": rank, "step": 9, "phase": "eval", "t": t + second}, t + second)
        assert wd.check(t + second + 0.5) is None, second
    assert wd.hang_timeout()[0] == 120


def test_a_liveness_beat_older_than_the_phase_news_does_not_undo_it() -> None:
    wd, t = training(steps=10)
    wd.observe({"kind": "phase", "rank": 0, "step": 10, "phase": "collective", "t": 50.6}, t + 1)
    wd.observe({"kind": "alive", "rank": 0, "step": 10, "phase": "forward", "t": 50.5}, t + 1)  # same batch, sent before
    assert wd.ranks[0].phase == "collective"


def test_every_rank_slowing_together_is_no_straggler() -> None:
    wd, t = training(steps=40, noise=0.02)
    rng = random.Random(3)
    for step in range(40, 80):  # the whole machine slows: each rank 1.25-1.4x, one a little more than the rest
        t += 1.3
        for rank in range(4):
            slow = 1.4 if rank == 2 else rng.uniform(1.25, 1.3)
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 1.3, "compute_s": 0.8 * slow}, t)
        assert wd.check(t) is None, step


def test_a_requested_stop_that_srun_cut_short_is_not_a_failure() -> None:
    from clusterctl.runtime.controller.blame import stopped_on_request

    lines = [
        "srun: error: n2: tasks 2-3: Exited with exit code 85",
        "srun: launch/slurm: _step_signal: Terminating StepId=51.0",
        "srun: error: n1: task 0: Terminated",
        "srun: error: n1: task 1: Exited with exit code 85",
    ]
    assert stopped_on_request(parse_srun_lines(lines))
    assert not stopped_on_request(parse_srun_lines(["srun: error: n1: task 0: Killed", "srun: error: n1: task 1: Terminated"]))


def test_a_node_that_died_with_its_aggregator_is_lost_though_its_ranks_were_never_seen_ending() -> None:
    # lab.sh kill-node n2: its aggregator's connection drops first; rank 0 fails on the broken peer;
    # Slurm later kills the aggregator step on n1 too and srun says "Node failure on n2".
    lines = ["srun: error: n1: task 0: Exited with exit code 1", "srun: launch/slurm: _step_signal: Terminating StepId=1.0",
             "srun: error: Node failure on n2", "srun: error: n1: task 1: Killed"]
    facts = Facts(world=4, hosts=HOSTS, gpus_per_node=2, srun=parse_srun_lines(lines), lost_nodes={"n2": 5.0, "n1": 31.0},
                  failed_nodes={"n2"}, errors={0: "RuntimeError: Connection closed by peer"})
    verdict = blame_end(facts)
    assert verdict.code == ExitCode.NODE_LOST and [c["rank"] for c in verdict.culprits] == [2, 3]
    assert verdict.evidence["node"] == "n2" and 0 in [v["rank"] for v in verdict.victims]


def test_a_straggler_is_named_at_the_step_it_showed_when_its_steps_arrive_in_one_report() -> None:
    """A node reports its ranks' steps once a second: with short steps one check sees many new ones. The rank must
    be named from the steps themselves, not a check (a second) later."""
    wd, t = training(steps=30)
    assert wd.check(t) is None
    for step in range(30, 48):  # 18 steps of rank 3 at 1.5x, all in one report
        t += 1.5
        for rank in range(4):
            wd.observe({"kind": "step", "rank": rank, "step": step, "phase": "collective", "step_s": 1.5,
                        "compute_s": 1.2 if rank == 3 else 0.8}, t)
    finding = wd.check(t)
    assert finding is not None and finding.code == ExitCode.STRAGGLER
    assert [c["rank"] for c in finding.culprits] == [3]
    assert finding.evidence["due_step"] <= 47 and finding.evidence["since_step"] < finding.evidence["due_step"]


def test_a_loss_shared_with_a_rank_on_another_node_blames_no_node() -> None:
    """The precision corpus's false verdict (clean, 200 ms steps, the machine under load): rank 2 on n2 lost 0.0245 s
    a step, 1.39x, while rank 0 on n1 lost 0.0241 s: the loss is the machine's, not n2's. Once rank 0 is back at
    its peers' pace, rank 2's loss is its node's, and it is named."""
    wd, t = training(steps=30, step_s=0.2, compute={r: 0.062 for r in range(4)})
    for step in range(30, 90):
        t += 0.2
        step_all(wd, step, t, 0.2, {2: 0.0865, 0: 0.0861}, 0.062)
        assert wd.check(t) is None, step
    for step in range(90, 150):
        t += 0.2
        step_all(wd, step, t, 0.2, {2: 0.0865}, 0.062)
        if (finding := wd.check(t)) is not None:
            break
    assert finding is not None and [c["rank"] for c in finding.culprits] == [2] and finding.culprits[0]["host"] == "n2"


def test_a_slow_node_slows_both_its_ranks_and_is_named() -> None:
    """Both ranks of n2 at 1.5x (a node throttled as a whole): each loses as much as the other, on the same node."""
    wd, t = training(steps=30, noise=0.02)
    for step in range(30, 70):
        t += 1.2
        step_all(wd, step, t, 1.2, {2: 1.2, 3: 1.2}, 0.8)
        if (finding := wd.check(t)) is not None:
            break
    assert finding is not None and finding.code == ExitCode.STRAGGLER and finding.culprits[0]["host"] == "n2"


def test_the_compute_check_names_a_slow_rank_only_when_its_loss_is_its_nodes() -> None:
    from clusterctl.runtime.controller import straggler
    from clusterctl.runtime.rank.postchecks import judge_compute

    limits, hosts = straggler.Limits(1.25, 0.02, 0.01), ["node1", "node2"]
    throttled = judge_compute({0: 0.010, 1: 0.0101, 2: 0.0099, 3: 0.021}, limits, hosts, 2)
    assert [c["rank"] for c in throttled["slow"]] == [3] and throttled["slow"][0]["host"] == "node2"
    # a busy machine: rank 0 is past the factor, but a rank on the other node lost more than half as much
    busy = judge_compute({0: 0.0152, 1: 0.0100, 2: 0.0129, 3: 0.0099}, limits, hosts, 2)
    assert busy["slow"] == []
