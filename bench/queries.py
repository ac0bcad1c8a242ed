"""State of 1,000 jobs through the CLI query (squeue) and through pyslurm, one call each.

    .venv/bin/python bench/queries.py [--quick] [--jobs N] [--repeat R]

Brings the Slurm test cluster up with tests/slurmlab/lab.sh when it is down.
Submits a held job array of N tasks (`sbatch --hold --array=0-(N-1) --wrap true`),
asks for every task by its `<array>_<task>` id in one `jobs()` call (what
`SlurmBackend.info_many` does for `status`), R times through each path, and
cancels the array. Figures are medians, in-process (imports apart). Choosing
pyslurm has a one-off cost per process, given apart: `probe_ms` with an empty
probe cache (`scontrol --version` and `import pyslurm` in a child process),
`probe_cached_ms` with it filled; single-job and node lookups for scale.
--quick: 200 jobs, 3 repeats. Each task counts against slurmctld's
MaxJobCount (10,000 on the test cluster) until MinJobAge (600 s) after the
array is cancelled: do not run it in a loop on a shared test cluster.

Last line: {"jobs", "cli_ms", "pyslurm_ms", "ratio"} plus details.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAB = ROOT / "tests" / "slurmlab" / "lab.sh"


def lab_env() -> dict[str, str]:
    """The test cluster's environment, bringing it up first when it is down."""
    if subprocess.run(["bash", str(LAB), "status"], capture_output=True, timeout=120).returncode != 0:
        subprocess.run(["bash", str(LAB), "up"], check=True, capture_output=True, timeout=900)
    out = subprocess.run(["bash", str(LAB), "env"], check=True, capture_output=True, text=True).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    return env


def median_ms(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, answer = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        answer = call()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2), answer


def probe_ms(env: dict[str, str]) -> tuple[float, float]:
    """choose_query() in a fresh interpreter (its start and imports apart), with an empty probe cache, then with it filled."""
    code = ("import time; from clusterctl.backends.slurm.choose import choose_query; t = time.perf_counter(); q = choose_query();"
            " print(q.name, (time.perf_counter() - t) * 1000)")
    found = []
    with tempfile.TemporaryDirectory(prefix="clusterctl-bench-cache-") as cache:
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": cache},
                                 capture_output=True, text=True, check=True)
            name, ms = out.stdout.split()
            if name != "pyslurm":
                raise SystemExit(f"choose_query() picked {name}, not pyslurm")
            found.append(round(float(ms), 1))
    return found[0], found[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 jobs, 3 repeats")
    parser.add_argument("--jobs", type=int, default=0, help="array size (default 1000; --quick 200)")
    parser.add_argument("--repeat", type=int, default=0, help="calls per path (default 7; --quick 3)")
    args = parser.parse_args()
    count = args.jobs or (200 if args.quick else 1000)
    repeat = args.repeat or (3 if args.quick else 7)

    env = lab_env()
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    from clusterctl.backends.slurm import pyslurmprobe
    from clusterctl.backends.slurm.cliquery import CliQuery

    problem = pyslurmprobe.problem()
    if problem is not None:
        raise SystemExit(f"pyslurm cannot be used: {problem}")
    from clusterctl.backends.slurm.pyslurmquery import PyslurmQuery

    cli, fast = CliQuery(), PyslurmQuery()
    out = subprocess.run(["sbatch", "--parsable", "--hold", f"--array=0-{count - 1}", "--output=/dev/null", "--job-name=bench-queries",
                          "--wrap", "true"], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"sbatch refused the array: {out.stderr.strip()}\n(each task counts against MaxJobCount until"
                         " MinJobAge after it ends: a run leaves its tasks there for 10 minutes on the test cluster)")
    array = out.stdout.strip().split(";")[0]
    try:
        ids = [f"{array}_{k}" for k in range(count)]
        cli_ms, cli_answer = median_ms(lambda: cli.jobs(ids), repeat)
        fast_ms, fast_answer = median_ms(lambda: fast.jobs(ids), repeat)
        if cli_answer != fast_answer:
            raise SystemExit("the two paths disagree")
        if not all(info is not None and info.state == "PENDING" for info in cli_answer.values()):
            raise SystemExit("not every task was answered as PENDING")
        one_cli_ms, _ = median_ms(lambda: cli.job(array), repeat)
        one_fast_ms, _ = median_ms(lambda: fast.job(array), repeat)
        nodes_cli_ms, _ = median_ms(cli.nodes, repeat)
        nodes_fast_ms, _ = median_ms(fast.nodes, repeat)
    finally:
        subprocess.run(["scancel", array], env=env, check=False, capture_output=True)
    probe, cached = probe_ms(env)
    figures = {"jobs": count, "cli_ms": cli_ms, "pyslurm_ms": fast_ms, "ratio": round(cli_ms / fast_ms, 1),
               "probe_ms": probe, "probe_cached_ms": cached, "one_job_cli_ms": one_cli_ms, "one_job_pyslurm_ms": one_fast_ms,
               "nodes_cli_ms": nodes_cli_ms, "nodes_pyslurm_ms": nodes_fast_ms, "repeat": repeat,
               "load": round(os.getloadavg()[0], 1)}
    print(f"state of {count} jobs in one call: squeue {cli_ms} ms, pyslurm {fast_ms} ms ({figures['ratio']}x);"
          f" choosing pyslurm in a fresh process: {probe} ms, {cached} ms with the probe cached")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
