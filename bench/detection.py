"""Detection latency: a hang, a hang in a save, steady and intermittent stragglers, and false verdicts over a clean run.

4 ranks (2 emulated nodes x 2) on the local backend, each step busy-computing
about 1 s, with `watchdog.straggler_factor: 1.25` and checkpoint saves every
50 steps. `--script` picks the program: `trainer` (the reference trainer,
`--step-compute-s 1`, evaluations every 50 steps), `zero-change` (the plain
DDP example, examples/own-script/train_ddp.py, which imports nothing of
clusterctl: steps come from torch's hooks) or `contract` (the same script
with the Contract). Faults are injected from outside with `clusterctl drill`.

The watcher's cost: `watch_overhead` is rank 0's time in the step watcher's
own code over its time in steps (metrics.jsonl `watch_s` / `train_s`) in the
clean run; `watch_ab_overhead` (full run, the plain scripts only) is the
step time of the same 0.02 s-step job with `watchdog.steps: auto` over the
one with `off`, minus 1, as the script itself times them: three pairs, run
alternately, the median of each side (one pair alone is noise on 2 shared cores).

* clean + hang: one job trains CLEAN steps (300; 40 with --quick) with no
  verdict allowed, then `drill --hang 1`: seconds from the SIGSTOP to the
  verdict, and the hang timeout the watchdog derived.
* hang in a save (`hang_in_save_s`): the reference trainer with a model
  whose durable save takes a second or more (`checkpoint.interval: 10`);
  once rank 1 reports the `save` phase of its second save it is SIGSTOPped:
  seconds from the stop to the verdict (target: the step's hang timeout
  + 1 s, where `watchdog.save_timeout` would wait 900 s), and whether the
  verdict named rank 1.
* stragglers: one job each, `drill --slow 2:1.5` and `--slow 2:3` once the
  ranks are past warm-up: steps from the injection to the straggler verdict.
* intermittent straggler (`intermittent_straggler_steps`, also with --quick):
  the plain DDP script at 0.02 s steps, `drill --slow 2:1.5:0.3` (rank 2
  stopped 0.1 s in every 0.3 s: a stall on about one step in ten, which a
  window's trim alone leaves out): steps from the injection to the verdict
  (target: within 60 s, no false verdict).

Targets: hang <= 10 s, 1.5x straggler <= 30 steps, no false verdict in >= 300
clean steps. There is no peer to run beside it: torch itself calls a hang
only when a collective times out (NCCL 10 min, gloo 30 min by default).

    python bench/detection.py [--quick] [--script trainer|zero-change|contract]

Last line: {"script", "hang_timeout_s", "hang_detect_s", "hang_in_save_s", "hang_in_save_timeout_s", "straggler_1_5x_steps",
"straggler_3x_steps", "intermittent_straggler_steps", "intermittent_straggler_s", "false_verdicts", "clean_steps",
"watch_overhead", "watch_ab_overhead"}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clusterctl.runtime.controller.watchdog import straggler_warmup

REPO = Path(__file__).resolve().parents[1]
CLUSTERCTL = [str(Path(sys.executable).with_name("clusterctl"))]
WINDOW_FULL = straggler_warmup(20) + 20 + 5  # steps before a straggler is injected: the attempt's first window (left
# out by the rule), a full 20-step window after it, and some
INTERMITTENT = "2:1.5:0.3"  # rank 2 stopped 0.1 s in every 0.3 s: stalls longer than a ~20 ms step, on some steps


SCRIPTS = {"zero-change": "train_ddp.py", "contract": "train_ddp_contract.py"}


def command(script: str, steps: int, busy_s: float = 1.0) -> dict[str, Any]:
    if script == "trainer":
        return {"command": ["python3", "-m", "clusterctl.trainer", "--steps", str(steps), "--eval-interval", "50",
                            "--step-compute-s", str(busy_s)]}
    path = REPO / "examples" / "own-script" / SCRIPTS[script]
    return {"command": ["python3", str(path)], "env": {"STEPS": str(steps), "BUSY_S": str(busy_s)}}


def spec(name: str, runs: Path, steps: int, script: str = "trainer", busy_s: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "site": "local",
        "time_limit": "2h",
        "nodes": 2,
        "gpus_per_node": 2,
        "runs_root": str(runs),
        "watchdog": {"straggler_factor": 1.25},
        "checkpoint": {"interval": 50, "keep": 1},
        "model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "ffn": 64},
        "seq_len": 16,
        **command(script, steps, busy_s),
        **extra,
    }


def submit(scratch: Path, name: str, steps: int, script: str = "trainer", busy_s: float = 1.0, **extra: Any) -> Path:
    from clusterctl.actions.submit import submit_job
    from clusterctl.plan.job import load_job

    path = scratch / f"{name}.yaml"
    path.write_text(json.dumps(spec(name, scratch / "runs", steps, script, busy_s, **extra)))
    return submit_job(load_job(path), "local").run.path


def steps_done(attempt: Path) -> int:
    try:
        return len((attempt / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def verdict(attempt: Path) -> dict[str, Any] | None:
    try:
        found = json.loads((attempt / "verdict.json").read_text())
    except (OSError, ValueError):
        return None
    return None if found.get("ok") else found


def drill(run: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run([*CLUSTERCTL, "drill", str(run), *args, "--timeout", "600", "--json"], capture_output=True, text=True)
    return json.loads(out.stdout)


def step_at(attempt: Path, rank: int, when: float) -> int:
    """The last step `rank` finished at or before `when` (the controller's timeline)."""
    last = -1
    for line in (attempt / "timeline.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "step" and record.get("rank") == rank and record["t"] <= when:
            last = max(last, record["step"])
    return last


def cancel(run: Path) -> None:
    """Cancel the run's job and wait for it to end: its ranks write into the scratch folder until then."""
    from clusterctl.backends.local.backend import LocalBackend

    backend, job = LocalBackend(), str(json.loads((run / "state.json").read_text())["job_id"])
    backend.cancel(job)
    deadline = time.monotonic() + 60
    while (info := backend.info(job)) is not None and not info.finished and time.monotonic() < deadline:
        time.sleep(0.2)


def watch_overhead(attempt: Path) -> float | None:
    """Rank 0's time in the watcher's code over its time in steps (the last metrics line)."""
    try:
        last = json.loads((attempt / "metrics.jsonl").read_text().splitlines()[-1])
        return round(last["watch_s"] / last["train_s"], 6)
    except (OSError, IndexError, KeyError, ValueError, ZeroDivisionError):
        return None


def timed_run(scratch: Path, script: str, steps_mode: str, steps: int, n: int) -> float | None:
    """Seconds per step of a short job, as the script itself times them (its last line on rank 0)."""
    run = submit(scratch, f"ab-{steps_mode}-{n}", steps, script, 0.02,
                 watchdog={"straggler_factor": 1.25, "steps": steps_mode})
    log = run / "attempt-1" / "logs" / "node-0.log"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        for line in text.splitlines():
            if "trained " in line and " steps in " in line:
                done, took = line.split("trained ", 1)[1].split(" steps in ")
                return float(took.split()[0]) / int(done)
        time.sleep(1)
    return None


def clean_then_hang(scratch: Path, clean: int, show: Any, script: str) -> dict[str, Any]:
    run = submit(scratch, "clean-hang", clean + 1000, script)
    attempt = run / "attempt-1"
    start = time.monotonic()
    false = 0
    while steps_done(attempt) < clean:
        if verdict(attempt) is not None:
            false += 1
            show(f"false verdict after {steps_done(attempt)} clean steps: {verdict(attempt)['message']}")
            break
        time.sleep(1)
        if time.monotonic() - start > 60 * 60:
            raise RuntimeError("the clean run did not progress")
    clean_steps = steps_done(attempt)
    show(f"clean: {clean_steps} steps, {false} false verdict(s), {time.monotonic() - start:.0f} s")
    report = drill(run, "--hang", "1") if not false else {}
    if report:
        show(f"hang: detected={report['detected']} culprit_right={report['culprit_right']} after {report['seconds']} s")
    found = verdict(attempt) or {}
    cancel(run)
    return {
        "watch_overhead": watch_overhead(attempt),
        "clean_steps": clean_steps,
        "false_verdicts": false,
        "hang_detect_s": report.get("seconds") if report.get("culprit_right") else None,
        "hang_timeout_s": found.get("evidence", {}).get("hang_timeout_s"),
    }


SAVING_MODEL = {"layers": 4, "hidden": 512, "heads": 8, "vocab": 4096, "ffn": 2048}  # ~20M parameters: a save of seconds


def hang_in_save(scratch: Path, show: Any) -> dict[str, Any]:
    """SIGSTOP rank 1 while it saves a checkpoint: seconds to the verdict, and whom it named."""
    run = submit(scratch, "hang-in-save", 1000, "trainer", 0.2, checkpoint={"interval": 10, "keep": 1},
                 model=SAVING_MODEL)
    attempt = run / "attempt-1"
    timeline, seen, pid = attempt / "timeline.jsonl", 0, None
    deadline = time.monotonic() + 600
    while pid is None and time.monotonic() < deadline:
        lines = timeline.read_text().splitlines() if timeline.exists() else []
        for line in lines[seen:]:
            record = json.loads(line)
            if (record.get("kind"), record.get("rank"), record.get("phase")) == ("phase", 1, "save") and record["step"] >= 19:
                pid = json.loads((attempt / "manifest.json").read_text())["ranks"][1]["pid"]
                break
        seen = len(lines)
        time.sleep(0.02)
    result: dict[str, Any] = {"hang_in_save_s": None, "hang_in_save_timeout_s": None}
    if pid is None:
        show("hang in a save: rank 1 never reported its second save")
        cancel(run)
        return result
    stopped = time.time()
    os.kill(int(pid), signal.SIGSTOP)
    found = None
    while found is None and time.time() - stopped < 1000:
        found = verdict(attempt)
        time.sleep(0.05)
    took = time.time() - stopped
    cancel(run)
    culprits = [c.get("rank") for c in (found or {}).get("culprits") or []]
    show(f"hang in a save: {(found or {}).get('message')} ({took:.1f} s after the stop)")
    if found and culprits == [1]:
        result.update(hang_in_save_s=round(took, 2),
                      hang_in_save_timeout_s=found.get("evidence", {}).get("hang_timeout_s"))
    return result


def straggler(scratch: Path, slow: str, show: Any, script: str, busy_s: float = 1.0) -> tuple[int | None, float | None, int]:
    """`drill --slow SLOW` once a window is full: steps and seconds from the injection to the straggler verdict
    (None: missed), and false verdicts (one before the injection, or a verdict naming another rank)."""
    run = submit(scratch, f"slow-{slow.replace(':', '-')}", 20000 if busy_s < 0.1 else 2000, script, busy_s)
    attempt = run / "attempt-1"
    while steps_done(attempt) < WINDOW_FULL:  # measure detection, not the window filling up
        if verdict(attempt) is not None:
            show(f"false verdict before the --slow {slow}: {verdict(attempt)['message']}")
            cancel(run)
            return None, None, 1
        time.sleep(1)
    report = drill(run, "--slow", slow)
    found = verdict(attempt) or {}
    cancel(run)
    if not report.get("detected") or not report.get("culprit_right"):
        show(f"--slow {slow} straggler: missed ({report.get('note') or report.get('message')})")
        return None, None, 1 if found else 0
    onset = step_at(attempt, 2, report["injected_at"])
    named = found["evidence"]["step"]
    show(f"--slow {slow} straggler: named after {named - onset} steps ({report['seconds']} s) by the"
         f" {found['evidence'].get('rule')} rule, ratio {found['evidence']['ratio']}")
    return named - onset, report["seconds"], 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 clean steps, the hang, the hang in a save and the intermittent straggler (a few minutes)")
    parser.add_argument("--script", choices=("trainer", *SCRIPTS), default="trainer", help="the program the ranks run")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(REPO))

    def show(text: str) -> None:
        print(text, flush=True)

    with tempfile.TemporaryDirectory(prefix="clusterctl-detect-") as tmp:
        scratch = Path(tmp)
        os.environ["CLUSTERCTL_LOCAL_STATE"] = str(scratch / "local-state")
        result = clean_then_hang(scratch, 40 if args.quick else 300, show, args.script)
        result["straggler_1_5x_steps"] = result["straggler_3x_steps"] = result["watch_ab_overhead"] = None
        result.update(hang_in_save(scratch, show))
        steps, seconds, false = straggler(scratch, INTERMITTENT, show, "zero-change", 0.02)
        result["intermittent_straggler_steps"], result["intermittent_straggler_s"] = steps, seconds
        result["false_verdicts"] += false
        show(f"watcher: {result['watch_overhead']} of rank 0's step time in its own code")
        if not args.quick:
            for slow, key in (("2:1.5", "straggler_1_5x_steps"), ("2:3", "straggler_3x_steps")):
                steps, _, false = straggler(scratch, slow, show, args.script)
                result[key] = steps
                result["false_verdicts"] += false
            if args.script != "trainer":
                times: dict[str, list[float]] = {"off": [], "auto": []}
                for n in range(3):
                    for mode in ("off", "auto"):
                        took = timed_run(scratch, args.script, mode, 400, n)
                        if took:
                            times[mode].append(took)
                off, on = (sorted(t)[len(t) // 2] if t else None for t in times.values())
                if off and on:
                    result["watch_ab_overhead"] = round(on / off - 1, 4)
                    show(f"A/B: {off * 1000:.2f} ms a step with watchdog.steps off, {on * 1000:.2f} ms with auto")
    result["script"] = args.script
    keys = ("script", "hang_timeout_s", "hang_detect_s", "hang_in_save_s", "hang_in_save_timeout_s", "straggler_1_5x_steps", "straggler_3x_steps", "intermittent_straggler_steps",
            "intermittent_straggler_s", "false_verdicts", "clean_steps", "watch_overhead", "watch_ab_overhead")
    print(json.dumps({k: result[k] for k in keys}))


if __name__ == "__main__":
    main()
