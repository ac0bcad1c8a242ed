"""Nine attacks by another real user on runs they do not own, and a hang found in the middle of the flood.

The stranger is a second real user (`ccstranger`, made when missing: run as
root), running bench/programs/stranger.py with the system's Python. What
the owner would check after each attack: no code of the stranger's ran (a
marker file their payload would touch), no verdict changed, no node blamed,
the run's outcome unchanged.

1. planted checkpoint: a generation whose DCP index runs the stranger's code,
   in a checkpoint.dir they made first in a shared scratch, and in one of the
   owner's that others can write;
2. a runs root others can write (refused at submit), and a run directory
   that became writable after submit, whose wrapper the stranger swaps
   (refused by `requeue` and by the batch script itself);
3. a forged post-check outcome naming nodes (one that does not exist);
4. a rewritten registration of rank 2 with failed preflight results, the
   arrival counter held back;
5. a stop request, again and again;
6. malformed entries in the store's lists (duplicates, errored, returned);
7. lines nested past the JSON parser's depth to the watch port;
8. a flood of refused hellos with long node names (the batch log must stay small);
9. a `suspects.jsonl` link planted in a runs root others can write.
Attacks 3-8 hit one running job (the plain DDP example, 4 ranks on 2
emulated nodes, ~0.3 s steps): the store ones first, then the watch-port
flood, during which `clusterctl drill --hang 1` stops a rank. Its hang
verdict must come on time with rank 1 its only culprit. The full run also
runs the same job and hang with no stranger, for `verdict_latency_ratio`
(flooded / quiet; the target is <= 1.5).

    python bench/hostile.py [--quick]

Last line: {"attacks_tried", "attacks_refused", "stranger_code_runs", "forged_verdicts", "nodes_blamed",
"connections_tried", "batch_log_growth_kb", "verdict_latency_s", "quiet_verdict_latency_s",
"verdict_latency_ratio", "controller_peak_rss_mb", "store_attacks_by"}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLUSTERCTL = [str(Path(sys.executable).with_name("clusterctl"))]
SCRIPT = REPO / "examples" / "own-script" / "train_ddp.py"


def wait_for(what: str, ready: Any, timeout: float = 180, explain: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}" + (f"\n{explain()}" if explain else ""))


def shown(env: dict[str, str], run: Path) -> str:
    """The run's state and its batch logs' last lines: where a stuck bench stuck."""
    logs = sorted(run.glob("slurm-*.out"))
    return f"state: {run_state(env, run)}" + "".join(
        f"\n{log.name} ends:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]) for log in logs)


STRANGER = "ccstranger"
PROGRAM = REPO / "bench" / "programs" / "stranger.py"


@dataclass
class Attack:
    name: str
    refused: bool
    note: str


def site_packages() -> Path:
    return Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")


def ensure_stranger() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        raise SystemExit("bench/hostile.py makes and runs as a second real user: run it as root (with runuser)")
    if subprocess.run(["id", STRANGER], capture_output=True, check=False).returncode != 0:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", STRANGER], check=True)


def stranger(work: Path, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run one of the stranger's attacks as that user; what it printed, or {"error": ...}."""
    program = work / "stranger.py"  # a copy they can read: the checkout may sit where they cannot
    if not program.exists():
        shutil.copy(PROGRAM, program)
        program.chmod(0o644)
    env = ["env", f"PYTHONPATH={site_packages()}", "HOME=/tmp"]
    done = subprocess.run(["runuser", "-u", STRANGER, "--", *env, "/usr/bin/python3", str(program), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    return {"error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]}


def clusterctl(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLUSTERCTL, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def run_state(env: dict[str, str], run: Path) -> str | None:
    """The run's state as `clusterctl status` derives it (state.json is only the submission's record)."""
    out = clusterctl(env, "status", str(run), "--json", timeout=120)
    try:
        found = json.loads(out.stdout)
    except ValueError:
        return None
    found = (found[0] if found else {}) if isinstance(found, list) else found
    return found.get("state")


def spec(work: Path, name: str, **fields: Any) -> Path:
    body = {"name": name, "site": "local", "time_limit": "20m", "nodes": 2, "gpus_per_node": 2,
            "runs_root": str(work / "runs"), "watchdog": {"hang_timeout": "60s"},
            "command": ["python3", str(SCRIPT)], "env": {"STEPS": "100000", "BUSY_S": "0.3"}, **fields}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(body))
    return path


# --- attacks on the file system: refused before anything runs ---------------------------------------------------
def planted_checkpoint(work: Path, env: dict[str, str]) -> Attack:
    scratch = work / "scratch"
    scratch.mkdir(mode=0o755)
    scratch.chmod(0o1777)  # a shared scratch: everyone may create, no one may rename another's
    marker = work / "ran-planted"
    theirs = stranger(work, "plant", str(scratch / "ckpt"), str(marker))
    first = clusterctl(env, "submit", str(spec(work, "planted", checkpoint={"dir": str(scratch / "ckpt")})))
    loose = scratch / "mine"
    loose.mkdir()
    loose.chmod(0o777)  # the owner's own, but others may write it
    stranger(work, "plant", str(loose), str(marker))
    second = clusterctl(env, "submit", str(spec(work, "planted-loose", checkpoint={"dir": str(loose)})))
    refused = (first.returncode == 65 and "belongs to another user" in first.stderr and second.returncode == 65
               and "can be written by other users" in second.stderr and not marker.exists() and "error" not in theirs)
    return Attack("1 planted checkpoint", refused, f"submit {first.returncode}, {second.returncode}: "
                  + (first.stderr.strip().splitlines() or [""])[-1][-160:])


def swapped_run(work: Path, env: dict[str, str]) -> Attack:
    loose = work / "loose-runs"
    loose.mkdir()
    loose.chmod(0o777)
    at_submit = clusterctl(env, "submit", str(spec(work, "loose-root", runs_root=str(loose))))
    entered = work / "entered-runs"  # others may enter it, not write it: the rule passes it
    entered.mkdir(mode=0o755)
    entered.chmod(0o755)
    made = clusterctl(env, "submit", str(spec(work, "swapped", runs_root=str(entered))), "--dry-run", "--json")
    run = Path(json.loads(made.stdout)["run"])
    run.chmod(0o777)  # after submit, the run became writable by others (a chmod, a restored backup)
    marker = work / "ran-swapped"
    swapped = stranger(work, "swap", str(run), str(marker))
    requeue = clusterctl(env, "requeue", str(run))
    batch = subprocess.run(["bash", str(run / "job.sbatch")], capture_output=True, text=True, timeout=60, check=False,
                           env={"PATH": os.environ["PATH"], "HOME": str(work)})
    refused = (at_submit.returncode == 65 and requeue.returncode == 65 and batch.returncode == 77
               and swapped.get("swapped") is True and not marker.exists() and not list(loose.iterdir()))
    return Attack("2 runs root and run directory", refused,
                  f"submit {at_submit.returncode}, requeue {requeue.returncode}, batch script {batch.returncode},"
                  f" swapped {swapped}, stranger's code ran {marker.exists()}, loose root holds"
                  f" {sorted(p.name for p in loose.iterdir())}")


def planted_link(work: Path, env: dict[str, str]) -> Attack:
    root = work / "sticky-runs"
    root.mkdir()
    root.chmod(0o1777)
    target = work / "root-only"
    target.write_text("")
    target.chmod(0o600)
    linked = stranger(work, "link", str(root), str(target))
    done = clusterctl(env, "submit", str(spec(work, "linked", runs_root=str(root))))
    refused = done.returncode == 65 and target.read_text() == "" and "error" not in linked
    return Attack("9 suspects.jsonl link", refused, f"submit {done.returncode}")


# --- attacks on a running job: nothing counts -------------------------------------------------------------------
def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def store_attack(work: Path, host: str, port: int) -> str:
    """The store's writes as the stranger when their Python can load torch; else from another process of the
    owner's (the store has no notion of users: whoever reaches the port is anyone)."""
    done = stranger(work, "store", host, str(port))
    if "error" not in done:
        return "stranger"
    subprocess.run([sys.executable, str(PROGRAM), "store", host, str(port)], capture_output=True, timeout=120, check=True)
    return f"owner's process ({done['error'][-80:]})"


def verdicts(run: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(run.glob("attempt-*/verdict.json")):
        verdict = json.loads(path.read_text())
        if not verdict.get("ok", True):
            found.append(verdict)
    return found


def job(work: Path, env: dict[str, str], hostile: bool) -> dict[str, Any]:
    name = "attacked" if hostile else "quiet"
    out = clusterctl(env, "submit", str(spec(work, name)), "--json")
    if out.returncode != 0:
        raise SystemExit(f"the {name} job was not submitted: {out.stderr.strip()}")
    run = Path(json.loads(out.stdout)["run"])
    attempt = run / "attempt-1"
    metrics = attempt / "metrics.jsonl"
    wait_for("training", lambda: metrics.is_file() and len(metrics.read_text().splitlines()) > 8,
             explain=lambda: shown(env, run))
    ready = json.loads((attempt / "controller.json").read_text())
    host = json.loads((attempt / "attempt.json").read_text())["master_addr"]
    batch_log = next(run.glob("slurm-*.out"))
    log_before = batch_log.stat().st_size
    result: dict[str, Any] = {"run": str(run)}
    flood = None
    if hostile:
        result["store_by"] = store_attack(work, host, int(ready["port"]))
        steps = len(metrics.read_text().splitlines())
        time.sleep(5)  # long enough for a forged verdict or stop to act
        result["trained_on"] = (len(metrics.read_text().splitlines()) > steps and not verdicts(run)
                                and not (run / "attempt-2").exists())  # no forged stop moved it on
        program = work / "stranger.py"
        flood = subprocess.Popen(["runuser", "-u", STRANGER, "--", "/usr/bin/python3", str(program), "watch", host,
                                  str(ready["watch_port"]), "25"], stdout=subprocess.PIPE, text=True)
        time.sleep(5)  # the flood alone first: no verdict may come of it
    peaks: list[float] = []
    sampling = threading.Event()

    def sample() -> None:  # the controller exits soon after its verdict: its high-water mark is read while it runs
        while not sampling.is_set():
            value = peak_rss_mb(int(ready["pid"]))
            if value:
                peaks.append(value)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before = verdicts(run)
    drill = clusterctl(env, "drill", str(run), "--hang", "1", "--json", "--timeout", "60")
    sampling.set()
    sampler.join(5)
    if flood is not None:
        flooded = flood.communicate(timeout=60)[0].strip().splitlines()
        result["connections"] = json.loads(flooded[-1])["connections"] if flooded else 0
    clusterctl(env, "cancel", str(run))
    wait_for("the cancel", lambda: run_state(env, run) in ("cancelled", "failed", "completed"), 120,
             lambda: shown(env, run))
    report = json.loads(drill.stdout) if drill.stdout.strip().startswith("{") else {}
    after = verdicts(run)
    others = [v for v in after if v.get("code") not in (82, 89)]
    result.update({
        "latency_s": report.get("seconds"),
        "hang_found": bool(report.get("detected") and report.get("culprit_right")),
        "forged": len(before) + len(others),  # any verdict before the drill's, or after it but not its hang
        "log_growth_kb": round((batch_log.stat().st_size - log_before) / 1024, 1),
        "rss_mb": round(max(peaks), 1) if peaks else None,
    })
    return result


def blamed(env: dict[str, str], work: Path) -> int:
    """Suspects in the runs root that no drill put there."""
    out = clusterctl(env, "suspects", "--runs-root", str(work / "runs"), "--all", "--json")
    try:
        rows = json.loads(out.stdout) if out.stdout.strip() else []
    except ValueError:
        return 0
    rows = rows.get("suspects", rows) if isinstance(rows, dict) else rows
    return sum(1 for row in rows if isinstance(row, dict) and not row.get("drill"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the nine attacks and the flooded hang (about 3 minutes)")
    args = parser.parse_args()
    ensure_stranger()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cc-hostile-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the stranger may enter, as a shared file system's project space
        (work / "runs").mkdir(mode=0o700)
        env = {**os.environ, "CLUSTERCTL_LOCAL_STATE": str(work / "local-state")}
        attacks = [planted_checkpoint(work, env), swapped_run(work, env), planted_link(work, env)]
        attacked = job(work, env, hostile=True)
        quiet = None if args.quick else job(work, env, hostile=False)
        markers = sorted(p.name for p in work.glob("ran-*"))
        nodes = blamed(env, work)
        on_job = attacked["trained_on"] and attacked["hang_found"] and attacked["forged"] == 0 and nodes == 0
        attacks += [Attack("3 forged post-check", on_job, "no verdict, no suspect"),
                    Attack("4 rewritten registration", on_job, "no preflight verdict, no node excluded"),
                    Attack("5 repeated stop", on_job, "trained on, no save forced"),
                    Attack("6 malformed list entries", on_job, "the controller judged on"),
                    Attack("7 nested brackets", attacked["hang_found"], f"hang found in {attacked['latency_s']} s"),
                    Attack("8 refused hellos", attacked["log_growth_kb"] < 64, f"batch log +{attacked['log_growth_kb']} KB")]
        for attack in attacks:
            print(f"{attack.name}: {'refused' if attack.refused else 'NOT REFUSED'} ({attack.note})", file=sys.stderr)
        print(f"attacked job: {attacked}" + (f"; quiet job: {quiet}" if quiet else "") + f" [{time.monotonic() - began:.0f} s]",
              file=sys.stderr)
    ratio = (round(attacked["latency_s"] / quiet["latency_s"], 2)
             if quiet and attacked["latency_s"] and quiet["latency_s"] else None)
    print(json.dumps({
        "attacks_tried": len(attacks),
        "attacks_refused": sum(a.refused for a in attacks),
        "stranger_code_runs": len(markers),
        "forged_verdicts": attacked["forged"],
        "nodes_blamed": nodes,
        "connections_tried": attacked.get("connections"),
        "batch_log_growth_kb": attacked["log_growth_kb"],
        "verdict_latency_s": attacked["latency_s"],
        "quiet_verdict_latency_s": quiet["latency_s"] if quiet else None,
        "verdict_latency_ratio": ratio,
        "controller_peak_rss_mb": attacked["rss_mb"],
        "store_attacks_by": attacked["store_by"],
    }))


if __name__ == "__main__":
    main()
