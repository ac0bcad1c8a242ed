"""Remote use against running it on the login node: `status` of 100 runs, and submit until Slurm has the job.

    .venv/bin/python bench/remote.py [--quick] [--runs N] [--repeat K]

Starts a private sshd (tests/sshlab, the test suite's) in front of this
machine, whose login shell has the Slurm test cluster's SLURM_CONF (brought
up with tests/slurmlab/lab.sh when it is down). Each figure is the wall time
of one `clusterctl` command as a user runs it (interpreter start included),
the median of K runs:

- local_status_ms:  `clusterctl status --all --json --runs-root R` here;
- remote_status_ms: the same with `--remote` (one SSH connection, the login
  node's clusterctl, its JSON shown here);
- local_submit_ms / remote_submit_ms: `clusterctl submit` of a 2-node job
  until sbatch has answered (the job pends: every node of the test cluster
  is drained meanwhile), here and with `--remote` (render here, ship the run
  and a small code tree, submit there).

Last line: {"runs", "local_status_ms", "remote_status_ms", "remote_submit_ms", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from status import write_runs  # noqa: E402  (bench/status.py: the same synthetic runs)

from tests.sshlab.lab import HostEntry, ssh_lab, write_client_config  # noqa: E402
from tests.sshlab.plugin import login_profile  # noqa: E402

CLUSTERCTL = str(Path(sys.executable).with_name("clusterctl"))
LAB = ROOT / "tests" / "slurmlab" / "lab.sh"


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return (time.perf_counter() - began) * 1000


def median_ms(argv: list[str], env: dict[str, str], cwd: Path, repeat: int) -> float:
    return round(statistics.median(timed(argv, env, cwd) for _ in range(repeat)), 1)


def slurm_env() -> dict[str, str]:
    subprocess.run(["bash", str(LAB), "up"], check=True, capture_output=True, timeout=300)
    out = subprocess.run(["bash", str(LAB), "env"], check=True, capture_output=True, text=True).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line.removeprefix("export ").split("=", 1)
            env[key] = value.strip("'\"")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs of each command (under a minute)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=None)
    args = parser.parse_args()
    repeat = args.repeat or (3 if args.quick else 7)
    env = slurm_env()
    with tempfile.TemporaryDirectory(prefix="clusterctl-bench-remote-") as tmp, \
            ssh_lab(Path(tmp) / "sshd", name="bench", profile=login_profile()) as lab:
        base = Path(tmp)
        runs = base / "runs"
        runs.mkdir()
        write_runs(runs, args.runs, 1000, share=True)
        cfg = write_client_config(base / "laptop" / "config", [HostEntry("cluster", lab)])
        env.update(cfg.env)
        status = [CLUSTERCTL, "status", "--all", "--json", "--runs-root", str(runs)]
        local_status = median_ms(status, env, base, repeat)
        remote_status = median_ms([*status, "--remote", "cluster"], env, base, repeat)

        code = base / "project"
        code.mkdir()
        subprocess.run(["git", "init", "-q", str(code)], check=True)
        (code / "train.py").write_text("print('hello')\n")
        spec = code / "job.yaml"
        spec.write_text(json.dumps({"name": "bench", "site": "slurm-lab", "time_limit": "10m", "nodes": 2, "gpus_per_node": 1,
                                    "runs_root": str(base / "submitted"), "command": ["python3", "train.py"]}))
        subprocess.run(["scontrol", "update", "nodename=n[1-4]", "state=drain", "reason=bench"], env=env, check=True)
        try:
            local_submit = median_ms([CLUSTERCTL, "submit", str(spec)], env, code, repeat)
            remote_submit = median_ms([CLUSTERCTL, "submit", str(spec), "--remote", "cluster"], env, code, repeat)
        finally:
            subprocess.run(["scancel", "--name", "bench"], env=env, check=False)
            out = subprocess.run(["squeue", "-h", "-o", "%i", "-n", "bench"], env=env, capture_output=True, text=True)
            if out.stdout.strip():
                subprocess.run(["scancel", *out.stdout.split()], env=env, check=False)
            subprocess.run(["scontrol", "update", "nodename=n[1-4]", "state=resume"], env=env, check=False)
        figures = {"runs": args.runs, "local_status_ms": local_status, "remote_status_ms": remote_status,
                   "remote_submit_ms": remote_submit, "local_submit_ms": local_submit,
                   "remote_vs_local_status": round(remote_status / local_status, 2),
                   "remote_vs_local_submit": round(remote_submit / local_submit, 2), "repeat": repeat}
        print(f"status of {args.runs} runs: {local_status} ms here, {remote_status} ms over SSH;"
              f" submit to pending: {local_submit} ms here, {remote_submit} ms over SSH", file=sys.stderr)
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
