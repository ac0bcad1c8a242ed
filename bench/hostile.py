"""A flood of hostile connections at a training job's controller, and a real hang in the middle of it.

The plain DDP example (4 ranks, 2 emulated nodes x 2, ~0.3 s steps) on the
local backend. Once it trains, a stranger's flood starts against the
controller's watch port (found in controller.json, as a port scan would find
it) from several threads: connections that never speak, connections that
send bytes without end, forged hellos (a guessed MAC) for each node followed
by beats at step 10^6 and a rank's `gone`, opened and closed without pause.
While it floods, `clusterctl drill --hang 1` stops a rank.

Figures: `connections_tried` (hostile connections opened), the controller's
peak resident memory during the flood (`controller_peak_rss_mb`, VmHWM),
`verdict_latency_s` (the drill's seconds from SIGSTOP to the hang verdict;
the target is the normal hang target, <= 10 s), `false_verdicts` (verdicts
before the injection, or that blame anything but rank 1: must be 0) and
`forged_accepted` (forged records that reached the timeline: must be 0). The
full run also runs the same job and hang without the flood, for
`verdict_latency_ratio` (flooded / quiet) and `rss_ratio`. There is no peer
to run beside it: torchrun's and submitit's agents have no such port.

    python bench/hostile.py [--quick]

Last line: {"connections_tried", "controller_peak_rss_mb", "verdict_latency_s", "false_verdicts",
"forged_accepted", "quiet_verdict_latency_s", "verdict_latency_ratio", "quiet_rss_mb", "rss_ratio"}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLUSTERCTL = [str(Path(sys.executable).with_name("clusterctl"))]
SCRIPT = REPO / "examples" / "own-script" / "train_ddp.py"


def wait_for(what: str, ready: Any, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


class Flood:
    """Hostile connections from several threads until stopped; counts what it tried."""

    def __init__(self, port: int, nodes: list[str], threads: int) -> None:
        self.port, self.nodes, self.stop = port, nodes, threading.Event()
        self.tried = 0
        self.lock = threading.Lock()
        self.workers = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def finish(self) -> int:
        self.stop.set()
        for worker in self.workers:
            worker.join(10)
        return self.tried

    def run(self, kind: int) -> None:
        held: list[socket.socket] = []
        while not self.stop.is_set():
            try:
                conn = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                time.sleep(0.01)
                continue
            with self.lock:
                self.tried += 1
            try:
                if kind % 3 == 0:  # silent: held open until the server's deadline closes it
                    held.append(conn)
                    if len(held) > 40:
                        held.pop(0).close()
                    continue
                if kind % 3 == 1:  # bytes without end, no newline
                    conn.sendall(b"A" * 65536)
                else:  # a forged hello for a node, beats far ahead, a rank's end, and gone
                    node = self.nodes[self.tried % len(self.nodes)]
                    lines = [{"kind": "hello", "node": node, "pid": 1, "mac": "0" * 64},
                             {"kind": "batch", "beats": [{"kind": "step", "rank": 0, "step": 10**6, "phase": "forward",
                                                          "step_s": 0.1, "compute_s": 0.1}]},
                             {"kind": "gone", "rank": 1, "pid": 1}]
                    conn.sendall("".join(json.dumps(m) + "\n" for m in lines).encode())
            except OSError:
                pass
            if kind % 3:
                conn.close()
        for conn in held:
            conn.close()


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def one(work: Path, flood: bool, threads: int) -> dict[str, Any]:
    spec = {"name": "hostile", "site": "local", "time_limit": "20m", "nodes": 2, "gpus_per_node": 2,
            "runs_root": str(work / "runs"), "watchdog": {"hang_timeout": "60s"},
            "command": ["python3", str(SCRIPT)], "env": {"STEPS": "100000", "BUSY_S": "0.3"}}
    work.mkdir(parents=True)
    (work / "job.yaml").write_text(json.dumps(spec))
    env = {**os.environ, "CLUSTERCTL_LOCAL_STATE": str(work / "local-state")}
    out = subprocess.run([*CLUSTERCTL, "submit", str(work / "job.yaml"), "--json"], capture_output=True, text=True, env=env,
                         check=True)
    run = Path(json.loads(out.stdout)["run"])
    attempt = run / "attempt-1"
    wait_for("training", lambda: (attempt / "metrics.jsonl").is_file() and len((attempt / "metrics.jsonl").read_text().splitlines()) > 8)
    ready = json.loads((attempt / "controller.json").read_text())
    hosts = json.loads((attempt / "attempt.json").read_text())["hosts"]
    hostile = Flood(int(ready["watch_port"]), hosts, threads) if flood else None
    if hostile:
        hostile.start()
        time.sleep(5)  # the flood first, alone: no verdict may come of it
    before = (attempt / "verdict.json").exists() and not json.loads((attempt / "verdict.json").read_text()).get("ok", True)
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
    drill = subprocess.run([*CLUSTERCTL, "drill", str(run), "--hang", "1", "--json", "--timeout", "60"], capture_output=True,
                           text=True, env=env, check=False)
    tried = hostile.finish() if hostile else 0
    sampling.set()
    sampler.join(5)
    rss = max(peaks, default=None)
    subprocess.run([*CLUSTERCTL, "cancel", str(run)], capture_output=True, env=env, check=False)
    report = json.loads(drill.stdout) if drill.stdout.strip().startswith("{") else {}
    timeline = (attempt / "timeline.jsonl").read_text() if (attempt / "timeline.jsonl").exists() else ""
    forged = sum(1 for line in timeline.splitlines() if '"step":1000000' in line.replace(" ", ""))
    false = int(before) + int(not (report.get("detected") and report.get("culprit_right")))
    return {"tried": tried, "rss_mb": round(rss, 1) if rss else None, "latency_s": report.get("seconds"),
            "false": false, "forged": forged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the flooded run only (under a minute)")
    parser.add_argument("--threads", type=int, default=6, help="flooding threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cc-hostile-") as tmp:
        flooded = one(Path(tmp) / "flooded", True, args.threads)
        print(f"flooded: {flooded}", file=sys.stderr)
        quiet = None if args.quick else one(Path(tmp) / "quiet", False, 0)
        if quiet:
            print(f"quiet: {quiet}", file=sys.stderr)
    result = {
        "connections_tried": flooded["tried"],
        "controller_peak_rss_mb": flooded["rss_mb"],
        "verdict_latency_s": flooded["latency_s"],
        "false_verdicts": flooded["false"],
        "forged_accepted": flooded["forged"],
        "quiet_verdict_latency_s": quiet["latency_s"] if quiet else None,
        "verdict_latency_ratio": round(flooded["latency_s"] / quiet["latency_s"], 2)
        if quiet and flooded["latency_s"] and quiet["latency_s"] else None,
        "quiet_rss_mb": quiet["rss_mb"] if quiet else None,
        "rss_ratio": round(flooded["rss_mb"] / quiet["rss_mb"], 2) if quiet and flooded["rss_mb"] and quiet["rss_mb"] else None,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
