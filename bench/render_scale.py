"""Render a 102,400-rank job, and the wrapper's start-up to exec per rank.

    python bench/render_scale.py [--quick]

Render: make_plan + render_run (job.sbatch, wrapper.sh, run.json) for tp 8,
pp 16, dp 800 on 12,800 8-GPU nodes; target < 2 s. Wrapper: wall time of
`bash wrapper.sh` for ranks of that job, whose command is `true`, with the
environment srun gives a task; the binding runs for real (the rail map's CPU
lists are folded onto CPUs this machine has); target < 100 ms. Standard
library only on that path: the wrapper is bash, and reads no run.json.

Last line: {"ranks": ..., "render_seconds": ..., "wrapper_startup_ms": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def big_plan():  # noqa: ANN201
    from clusterctl.config.site import Gpu, Partition, load_site
    from clusterctl.config.spec import JobSpec
    from clusterctl.plan import make_plan

    site, _ = load_site("dgx-h100")
    # Fold the DGX CPU lists onto CPUs that exist here so taskset really binds.
    ncpu = os.cpu_count() or 1
    node_type = site.node_types["dgx-h100"]
    gpus = [Gpu(index=g.index, numa=0, cpus=str(g.index % ncpu), nics=g.nics) for g in node_type.gpus]
    site = site.model_copy(
        update={
            "oversubscribe": True,
            "partitions": {"batch": Partition(node_type="dgx-h100", nodes="dgx-[00001-12800]", default=True)},
            "node_types": {"dgx-h100": node_type.model_copy(update={"gpus": gpus})},
        }
    )
    spec = JobSpec.model_validate(
        {
            "name": "scale",
            "time_limit": "4h",
            "parallel": {"tp": 8, "pp": 16, "dp": 800},
            "batch": {"micro": 1, "global": 12800},
            "command": ["true"],
        }
    )
    return spec, site, make_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    from clusterctl.render.scripts import render_run

    spec, site, make_plan = big_plan()
    repeats = 2 if args.quick else 5
    render_times = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        for _ in range(repeats):
            start = time.perf_counter()
            plan = make_plan(spec, site)
            rendered = render_run(plan, run_dir, python="/usr/bin/python3", standalone=True)
            render_times.append(time.perf_counter() - start)
        for name, text in rendered.files.items():
            (run_dir / name).write_text(text)
        run_json_kb = len(rendered.files["run.json"]) / 1024
        wrapper = run_dir / "wrapper.sh"
        samples = []
        ranks = [0, 7, 51_207, 102_399] * (5 if args.quick else 25)
        for rank in ranks:
            env = {
                "PATH": os.environ["PATH"],
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank % 8),
                "SLURM_NODEID": str(rank // 8),
                "SLURM_NTASKS": str(plan.world_size),
                "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "23456",
            }
            start = time.perf_counter()
            subprocess.run(["bash", str(wrapper)], env=env, check=True)
            samples.append((time.perf_counter() - start) * 1000)
    render_s = min(render_times)
    wrapper_ms = statistics.median(samples)
    print(f"render {plan.world_size} ranks: {render_s:.3f} s (best of {repeats}); run.json {run_json_kb:.1f} KiB")
    print(
        f"wrapper start-up to exec of the rank's command: median {wrapper_ms:.1f} ms, "
        f"p90 {statistics.quantiles(samples, n=10)[-1]:.1f} ms over {len(samples)} runs"
    )
    print(json.dumps({"ranks": plan.world_size, "render_seconds": round(render_s, 3), "wrapper_startup_ms": round(wrapper_ms, 1)}))


if __name__ == "__main__":
    main()
