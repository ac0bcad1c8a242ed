"""Precision of the verdicts: a scenario corpus of clean runs, script faults and real faults.

    .venv/bin/python bench/precision.py [--quick] [--lab] [--only NAME,...] [--list]

Every scenario is a real job (2 emulated nodes x 2 ranks on the local
backend; `--lab`: the Slurm test cluster, SLURM_CONF set), watched with the
spec's defaults. Faults are injected from outside with `clusterctl drill`.

* clean runs, where every verdict is false: plain DDP steps of 2 ms, 20 ms,
  200 ms and 1 s, beside one CPU burner and with the machine at load >= 4,
  the reference trainer, Lightning and Hugging Face, the clean stretch
  after a warm restart, and the compute check's judgment before training
  (16 short jobs at load >= 4; 4 with --quick). Each runs for its minutes, then is cancelled (the
  cancel is ours, not a verdict);
* script faults, where every suspect is false: the same exception on every
  rank, an exception on one rank's data shard, an import error, an argparse
  error, a path typo (refused at submit) and a rank-conditional barrier
  deadlock. The run must end blaming no node;
* real faults, each to be found with its culprit: a killed rank, a stopped
  rank (SIGSTOP), a 1.5x straggler at 50 ms and at 500 ms steps, a lost node.

Counted: `false_verdicts` (a failing verdict in a clean run, or a node
verdict where the script is at fault), `false_node_blames` (a node in the
scenario's runs root's suspects that no injected fault explains; each
scenario has a runs root of its own, so one wrong verdict is counted once
and its suspect excludes no node in the next scenario), `recall` (faults found
with the exact culprit over faults injected), detection latency per fault
class (`hang_p50_s`, `hang_p90_s`, `kill_p90_s`, `node_loss_p90_s`, from
the drill's injection to the verdict; `straggler_steps_p50`,
`straggler_steps_p90`, steps from the slowdown's onset to the step at which
the rule held; `straggler_verdict_steps_p90`, to the newest step reported
when the verdict landed, up to a node report's second later) and
`clean_minutes` (training minutes of the clean runs, and `load_minutes`
of those at load >= 4). `--quick` (a few minutes) runs one scenario of each
group and of each real-fault class.

Last line: {"false_verdicts", "false_node_blames", "recall", "hang_p50_s",
"hang_p90_s", "straggler_steps_p50", "straggler_steps_p90", "straggler_verdict_steps_p90", "kill_p90_s",
"node_loss_p90_s", "clean_minutes", "load_minutes", "scenarios"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detection import WINDOW_FULL, step_at  # step_at: the last step a rank finished by a time (the timeline's one reader)

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "bench" / "programs"
OWN = REPO / "examples" / "own-script"
CLUSTERCTL = [str(Path(sys.executable).with_name("clusterctl"))]
NODE_VERDICTS = {81, 82, 83, 86}
CANCELLED = 89
SCRIPT_ERROR = 88
SLOW_ONSET_STEPS = WINDOW_FULL  # steps a straggler's run trains before it is slowed (detection.py says why)


@dataclass
class Outcome:
    """What one scenario showed."""

    name: str
    group: str  # clean, script, real
    minutes: float = 0.0  # training minutes (clean runs)
    loaded: bool = False  # run with the machine at load >= 4
    false_verdicts: list[str] = field(default_factory=list)
    false_blames: list[str] = field(default_factory=list)
    kind: str = ""  # the real fault's class: hang, kill, straggler, node_loss
    found: bool | None = None  # a real fault: found with the exact culprit
    latency: float | None = None  # seconds (steps for a straggler: to the step at which the rule held)
    verdict_steps: float | None = None  # a straggler: steps to the newest one reported when the verdict landed
    note: str = ""


@dataclass
class Lab:
    scratch: Path
    site: str
    show: Callable[[str], None]
    runs: int = 0
    scenario: str = ""  # each scenario has its own runs root: one wrong verdict's suspects never exclude a node in the next

    @property
    def root(self) -> Path:
        return self.scratch / f"runs-{self.scenario}" if self.scenario else self.scratch / "runs"

    def spec(self, name: str, command: list[str], env: dict[str, str] | None = None, **extra: Any) -> Path:
        self.runs += 1
        path = self.scratch / f"{name}-{self.runs}.yaml"
        body: dict[str, Any] = {
            "name": name, "site": self.site, "nodes": 2, "gpus_per_node": 2, "time_limit": "2h",
            "runs_root": str(self.root), "command": command, "env": env or {},
            "checkpoint": {"interval": 50, "keep": 1},
            **extra,
        }
        path.write_text(json.dumps(body))
        return path

    def submit(self, spec: Path) -> Path:
        from clusterctl.actions.submit import load_for_submit, submit_job

        return submit_job(load_for_submit(spec), "slurm" if self.site != "local" else "local").run.path


def attempts(run: Path) -> list[Path]:
    return sorted(run.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1]))


def verdicts(run: Path) -> list[dict[str, Any]]:
    found = []
    for attempt in attempts(run):
        with contextlib.suppress(OSError, ValueError):
            v = json.loads((attempt / "verdict.json").read_text())
            if not v.get("ok", True):
                found.append(v)
    return found


def steps_done(run: Path) -> int:
    total = 0
    for attempt in attempts(run):
        with contextlib.suppress(OSError):
            total += len((attempt / "metrics.jsonl").read_text().splitlines())
    return total


def last_step(run: Path) -> int:
    try:
        return int(json.loads((attempts(run)[-1] / "metrics.jsonl").read_text().splitlines()[-1])["step"])
    except (OSError, IndexError, KeyError, ValueError):
        return -1


def state(run: Path) -> dict[str, Any]:
    out = subprocess.run([*CLUSTERCTL, "status", str(run), "--json"], capture_output=True, text=True, timeout=120)
    try:
        found = json.loads(out.stdout)
    except ValueError:
        return {}
    return (found[0] if found else {}) if isinstance(found, list) else found


def wait_final(run: Path, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = state(run)
        if st.get("state") in ("completed", "failed", "cancelled"):
            return st
        time.sleep(3)
    cancel(run)
    return state(run)


def cancel(run: Path) -> None:
    subprocess.run([*CLUSTERCTL, "cancel", str(run)], capture_output=True, text=True, timeout=120)


def suspects(lab: Lab) -> list[dict[str, Any]]:
    out = subprocess.run([*CLUSTERCTL, "suspects", "--runs-root", str(lab.root), "--all", "--json"],
                         capture_output=True, text=True, timeout=120)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return []


SECOND_HOST = "<the first attempt's second node>"  # node2 on the local backend, n2 or another on the test cluster


def second_host(run: Path, timeout: float = 300.0) -> str:
    """The first attempt's second node, once its attempt.json names its hosts (else the placeholder: the drill says why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
            return str(json.loads((run / "attempt-1" / "attempt.json").read_text())["hosts"][1])
        time.sleep(0.2)
    return SECOND_HOST


def drill(run: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run([*CLUSTERCTL, "drill", str(run), *args, "--timeout", "300", "--json"], capture_output=True,
                         text=True)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {"detected": False, "note": (out.stderr or out.stdout)[-300:]}


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """n CPU burners beside the job (the neighbours' load of a shared node)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def culprit_hosts(report: dict[str, Any]) -> set[str]:
    """The nodes a drill's verdict named: blaming them is right."""
    return {str(c["host"]) for c in report.get("culprits") or [] if isinstance(c, dict) and c.get("host")}


def seen(lab: Lab) -> set[str]:
    """The suspect lines there are now, each as a key (the listing is sorted by node, not by when they came)."""
    return {json.dumps(s, sort_keys=True) for s in suspects(lab)}


def new_blames(lab: Lab, before: set[str], allowed: set[str] = frozenset()) -> list[str]:
    """Suspect lines that came since `before` (seen) naming a node outside `allowed`."""
    found = [s for s in suspects(lab) if json.dumps(s, sort_keys=True) not in before]
    return [f"{s.get('node')}: {s.get('reason', '')[:120]}" for s in found if s.get("node") not in allowed]


# --- clean runs ---------------------------------------------------------------------------
def clean(lab: Lab, name: str, minutes: float, command: list[str], env: dict[str, str] | None = None,
          load: int = 0, **extra: Any) -> Outcome:
    before = seen(lab)
    out = Outcome(name, "clean", loaded=load >= 4)
    with burners(load):
        run = lab.submit(lab.spec(name, command, env, **extra))
        deadline = time.monotonic() + minutes * 60
        trained_from: float | None = None
        while time.monotonic() < deadline + (trained_from is None) * 300:
            if trained_from is None and steps_done(run) > 0:
                trained_from = time.monotonic()
                deadline = trained_from + minutes * 60
            if state(run).get("state") in ("completed", "failed", "cancelled"):
                break
            time.sleep(5)
        ended = time.monotonic()
        cancel(run)
        wait_final(run, 120)
    out.minutes = (ended - trained_from) / 60 if trained_from else 0.0
    out.false_verdicts = [v["message"] for v in verdicts(run) if v.get("code") != CANCELLED]
    out.false_blames = new_blames(lab, before)
    out.note = f"{steps_done(run)} steps in {len(attempts(run))} attempt(s)"
    return out


def preflight_compute(lab: Lab, runs: int, load: int = 4) -> Outcome:
    """The compute check's judgment on healthy ranks sharing a busy host's cores: `runs` short jobs with the
    compute and comm checks, each of whose verdicts (83 before training) would end a healthy attempt."""
    from clusterctl.config.spec import DEFAULT_PREFLIGHT

    before = seen(lab)
    out = Outcome(f"compute check at load {load}", "clean", loaded=load >= 4)
    with burners(load):
        for _ in range(runs):
            run = lab.submit(lab.spec("preflight-compute", ["python3", "-c", "pass"],
                                      preflight={"checks": [*DEFAULT_PREFLIGHT, "compute", "comm"]}))
            wait_final(run, 300)
            out.false_verdicts += [v["message"] for v in verdicts(run) if v.get("code") != CANCELLED]
    out.false_blames = new_blames(lab, before)
    out.note = f"{runs} jobs checked"
    return out


def plain(step_s: float, steps: int = 100000) -> tuple[list[str], dict[str, str]]:
    return ["python3", str(OWN / "train_ddp.py")], {"STEPS": str(steps), "BUSY_S": str(step_s)}


def after_warm_restart(lab: Lab, minutes: float) -> Outcome:
    """A killed rank restarts warm; the stretch after it must stay clean (no verdict against its own past)."""
    before = seen(lab)
    run = lab.submit(lab.spec("after-restart", ["python3", "-m", "clusterctl.trainer", "--steps", "100000",
                                               "--step-compute-s", "0.05"]))
    report = drill(run, "--kill", "1")
    out = Outcome("clean stretch after a warm restart", "clean")
    deadline = time.monotonic() + 300
    while len(attempts(run)) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    second = attempts(run)[-1]
    while not (second / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(1)
    began = time.monotonic()
    time.sleep(minutes * 60)
    out.minutes = (time.monotonic() - began) / 60
    later = [v["message"] for v in verdicts(run)[1:] if v.get("code") != CANCELLED]
    cancel(run)
    wait_final(run, 120)
    out.false_verdicts = later
    out.false_blames = new_blames(lab, before, culprit_hosts(report))
    out.note = f"kill detected={report.get('detected')}; {len(attempts(run))} attempt(s)"
    return out


# --- script faults ------------------------------------------------------------------------
def script_fault(lab: Lab, name: str, command: list[str], env: dict[str, str] | None = None, **extra: Any) -> Outcome:
    before = seen(lab)
    out = Outcome(name, "script")
    try:
        run = lab.submit(lab.spec(name.split()[0], command, env, **extra))
    except Exception as exc:  # noqa: BLE001 - a refusal at submit is this scenario's best outcome
        out.note = f"refused at submit: {str(exc)[:160]}"
        return out
    st = wait_final(run, 900)
    node_verdicts = [v["message"] for v in verdicts(run) if v.get("code") in NODE_VERDICTS and v.get("fault") == "node"]
    out.false_verdicts = node_verdicts
    out.false_blames = new_blames(lab, before)
    out.note = f"{st.get('state')} (exit {st.get('exit_code')}) after {len(attempts(run))} attempt(s)"
    return out


# --- real faults --------------------------------------------------------------------------
def real_fault(lab: Lab, name: str, kind: str, drill_args: list[str], command: list[str], env: dict[str, str] | None = None,
               **extra: Any) -> Outcome:
    before = seen(lab)
    out = Outcome(name, "real", kind=kind)
    run = lab.submit(lab.spec(kind, command, env, spares=1, **extra))
    if kind == "straggler":
        deadline = time.monotonic() + 600
        while last_step(run) < SLOW_ONSET_STEPS and time.monotonic() < deadline:
            time.sleep(0.5)
    early = [v["message"] for v in verdicts(run)]
    report = drill(run, *[second_host(run) if a == SECOND_HOST else a for a in drill_args])
    out.found = bool(report.get("detected")) and report.get("culprit_right") is True
    if kind == "straggler" and out.found:
        found = verdicts(run)[-1]
        onset = step_at(attempts(run)[0], int(drill_args[1].split(":")[0]), float(report["injected_at"]))
        evidence = found["evidence"]
        out.latency = float(evidence.get("due_step", evidence["step"]) - onset)  # the step the rule held at
        out.verdict_steps = float(evidence["step"] - onset)  # the newest step reported when the verdict landed
    elif out.found:
        out.latency = float(report.get("seconds") or 0.0)
    cancel(run)
    wait_final(run, 120)
    out.false_verdicts = early
    out.false_blames = new_blames(lab, before, culprit_hosts(report) if out.found else set())
    out.note = report.get("note") or report.get("message") or ""
    return out


# --- the corpus ---------------------------------------------------------------------------
def corpus(quick: bool) -> list[tuple[str, Callable[[Lab], Outcome]]]:
    m = 0.75 if quick else 4.5  # minutes of each clean run
    trainer = ["python3", "-m", "clusterctl.trainer", "--steps", "100000"]
    faults = str(PROGRAMS / "script_faults.py")
    scenarios: list[tuple[str, Callable[[Lab], Outcome]]] = [
        ("clean-2ms", lambda lab: clean(lab, "clean-2ms", m, *plain(0.002))),
        ("clean-20ms", lambda lab: clean(lab, "clean-20ms", m, *plain(0.02))),
        ("clean-200ms", lambda lab: clean(lab, "clean-200ms", m, *plain(0.2))),
        ("clean-1s", lambda lab: clean(lab, "clean-1s", m, *plain(1.0))),
        ("clean-burner", lambda lab: clean(lab, "clean-burner", m, *plain(0.02), load=1)),
        ("clean-load4-20ms", lambda lab: clean(lab, "clean-load4-20ms", 2 * m, *plain(0.02), load=4)),
        ("clean-load4-2ms", lambda lab: clean(lab, "clean-load4-2ms", 2 * m, *plain(0.002), load=4)),
        ("clean-load4-trainer", lambda lab: clean(lab, "clean-load4-trainer", 2 * m,
                                                   [*trainer, "--step-compute-s", "0.05"], load=4)),
        ("clean-trainer", lambda lab: clean(lab, "clean-trainer", m, [*trainer, "--step-compute-s", "0.2"])),
        ("clean-lightning", lambda lab: clean(lab, "clean-lightning", m, ["python3", str(OWN / "train_lightning.py")],
                                              {"STEPS": "100000", "STEP_S": "0.016"})),
        ("clean-hf", lambda lab: clean(lab, "clean-hf", m, ["python3", str(OWN / "train_hf.py")],
                                       {"STEPS": "100000", "STEP_S": "0.02"})),
        ("clean-after-restart", lambda lab: after_warm_restart(lab, m)),
        ("clean-compute-check", lambda lab: preflight_compute(lab, 4 if quick else 16)),
        ("script-every-rank", lambda lab: script_fault(lab, "script-every-rank", ["python3", faults], {"FAULT": "every"})),
        ("script-shard", lambda lab: script_fault(lab, "script-shard", ["python3", faults], {"FAULT": "shard"})),
        ("script-import", lambda lab: script_fault(lab, "script-import", ["python3", "-c", "import no_such_module_here"])),
        ("script-argparse", lambda lab: script_fault(lab, "script-argparse", ["python3", faults], {"FAULT": "argparse"})),
        ("script-typo", lambda lab: script_fault(lab, "script-typo", ["python3", "trian.py"])),
        ("script-barrier", lambda lab: script_fault(lab, "script-barrier", ["python3", faults], {"FAULT": "barrier"})),
        ("real-kill", lambda lab: real_fault(lab, "kill", "kill", ["--kill", "1"], *plain(0.05))),
        ("real-stop", lambda lab: real_fault(lab, "SIGSTOP on 1 s steps", "hang", ["--hang", "1"], *plain(1.0))),
        ("real-slow-50ms", lambda lab: real_fault(lab, "1.5x at 50 ms", "straggler", ["--slow", "2:1.5"], *plain(0.05))),
        ("real-slow-500ms", lambda lab: real_fault(lab, "1.5x at 500 ms", "straggler", ["--slow", "2:1.5"], *plain(0.5))),
        ("real-node", lambda lab: real_fault(lab, "node loss", "node_loss", ["--node", SECOND_HOST], *plain(0.05))),
    ]
    if quick:
        keep = {"clean-20ms", "clean-load4-20ms", "clean-compute-check", "script-every-rank", "script-typo", "real-kill", "real-stop",
                "real-slow-50ms", "real-node"}
        scenarios = [s for s in scenarios if s[0] in keep]
    return scenarios


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if q < 1 else round(ordered[-1], 2)


def figures(outcomes: list[Outcome]) -> dict[str, Any]:
    real = [o for o in outcomes if o.group == "real"]
    by_kind: dict[str, list[float]] = {}
    for o in real:
        if o.found and o.latency is not None:
            by_kind.setdefault(o.kind, []).append(o.latency)
    return {
        "false_verdicts": sum(len(o.false_verdicts) for o in outcomes),
        "false_node_blames": sum(len(o.false_blames) for o in outcomes),
        "recall": round(sum(1 for o in real if o.found) / len(real), 3) if real else None,
        "hang_p50_s": quantile(by_kind.get("hang", []), 0.5),
        "hang_p90_s": quantile(by_kind.get("hang", []), 0.9),
        "straggler_steps_p50": quantile(by_kind.get("straggler", []), 0.5),
        "straggler_steps_p90": quantile(by_kind.get("straggler", []), 0.9),
        "straggler_verdict_steps_p90": quantile([o.verdict_steps for o in real if o.verdict_steps is not None], 0.9),
        "kill_p90_s": quantile(by_kind.get("kill", []), 0.9),
        "node_loss_p90_s": quantile(by_kind.get("node_loss", []), 0.9),
        "clean_minutes": round(sum(o.minutes for o in outcomes if o.group == "clean"), 1),
        "load_minutes": round(sum(o.minutes for o in outcomes if o.group == "clean" and o.loaded), 1),
        "scenarios": len(outcomes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one scenario of each group and fault class (minutes)")
    parser.add_argument("--lab", action="store_true", help="on the Slurm test cluster (SLURM_CONF must be set)")
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--repeat", type=int, default=1, help="run the corpus this many times")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args()
    scenarios = corpus(args.quick)
    if args.only:
        wanted = set(args.only.split(","))
        scenarios = [s for s in corpus(False) if s[0] in wanted]
    if args.list:
        print("\n".join(name for name, _ in scenarios))
        return
    if args.lab and not os.environ.get("SLURM_CONF"):
        raise SystemExit("--lab needs SLURM_CONF (the Slurm test cluster's: tests/slurmlab/lab.sh)")
    os.environ.setdefault("PYTHONPATH", str(REPO))

    def show(text: str) -> None:
        print(text, flush=True)

    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="clusterctl-precision-") as tmp:
        scratch = Path(tmp)
        os.environ["CLUSTERCTL_LOCAL_STATE"] = str(scratch / "local-state")
        os.chdir(scratch)  # the ranks' directory: the path typo is looked for here
        lab = Lab(scratch, "slurm-lab" if args.lab else "local", show)
        for repeat in range(args.repeat):
            for name, run in scenarios:
                began = time.monotonic()
                lab.scenario = f"{name}-{repeat}"
                o = run(lab)
                outcomes.append(o)
                tail = "" if o.found is None else f" found={o.found} latency={o.latency}"
                show(f"{name}: {len(o.false_verdicts)} false verdict(s), {len(o.false_blames)} false blame(s),"
                     f" {o.minutes:.1f} clean min{tail}; {o.note} [{time.monotonic() - began:.0f} s]")
                for text in o.false_verdicts + o.false_blames:
                    show(f"  false: {text[:300]}")
    print(json.dumps(figures(outcomes)))


if __name__ == "__main__":
    main()
