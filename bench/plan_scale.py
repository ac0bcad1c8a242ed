"""Plan + full rank map at 1k, 10k and 102,400 ranks (tp8 pp16 dp800).

Each size runs in a fresh subprocess so its peak RSS is its own. Target at
102,400 ranks: < 1 s and < 500 MB RSS, cost linear in ranks. Also the
refusal of an impossible size (`nodes: 100000000` on the 4-node partition of
the slurm-lab site), through the same `load_job` every command uses, in a
fresh process: target < 100 ms and < 100 MB peak RSS (the interpreter and
its imports included).

    python bench/plan_scale.py [--quick] [--repeat N]

Last line: {"ranks": ..., "seconds": ..., "peak_rss_mb": ..., "refuse_seconds": ...,
"refuse_peak_rss_mb": ...} for the largest size.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SIZES = {  # ranks: (tp, pp, dp) on 8-GPU DGX H100 nodes
    1024: (8, 4, 32),
    10240: (8, 16, 80),
    102400: (8, 16, 800),
}


def one(ranks: int, repeat: int) -> dict[str, float]:
    """Time make_plan + rank map + the --json document for one size, in this process."""
    from clusterctl.config.site import Partition, load_site
    from clusterctl.config.spec import JobSpec
    from clusterctl.plan import make_plan

    tp, pp, dp = SIZES[ranks]
    site, _ = load_site("dgx-h100")
    nodes = ranks // 8
    site = site.model_copy(
        update={"partitions": {"batch": Partition(node_type="dgx-h100", nodes=f"dgx-[00001-{nodes:05d}]", default=True)}}
    )
    spec = JobSpec.model_validate(
        {
            "name": "scale",
            "time_limit": "1h",
            "parallel": {"tp": tp, "pp": pp, "dp": dp},
            "batch": {"micro": 1, "global": dp * 16},
            "model": {"layers": 128, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256},
            "sharding": "zero1",
        }
    )
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        plan = make_plan(spec, site)
        rank_map = plan.rank_map()
        doc = plan.as_json()
        best = min(best, time.perf_counter() - start)
        assert len(rank_map) == ranks and len(doc["rank_map"]) == ranks and plan.world_size == ranks
    start = time.perf_counter()
    text = json.dumps(doc, separators=(",", ":"))
    dump_s = time.perf_counter() - start
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "ranks": ranks,
        "seconds": round(best, 4),
        "json_seconds": round(dump_s, 4),
        "json_mb": round(len(text) / 1e6, 1),
        "peak_rss_mb": round(rss_mb, 1),
    }


def refuse(repeat: int) -> dict[str, float]:
    """Time the refusal of `nodes: 100000000` on a 4-node partition, in this process."""
    import tempfile
    import tracemalloc
    from pathlib import Path

    from clusterctl.errors import ConfigError
    from clusterctl.plan.job import load_job

    with tempfile.TemporaryDirectory() as scratch:
        spec = Path(scratch) / "job.yaml"
        spec.write_text("name: typo\nsite: slurm-lab\ntime_limit: 1h\nnodes: 100000000\ncommand: [python, train.py]\n")

        def attempt() -> float:
            start = time.perf_counter()
            try:
                load_job(spec)
            except ConfigError as exc:
                assert "partition gpu has 4 nodes" in str(exc), exc
            else:
                raise AssertionError("an impossible size was accepted")
            return time.perf_counter() - start

        best = min(attempt() for _ in range(repeat))  # the first one included: a CLI call pays it
        tracemalloc.start()  # separately: tracing slows the pure-Python YAML reader several times
        attempt()
        _, traced = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"refuse_seconds": round(best, 4), "refuse_peak_rss_mb": round(rss_mb, 1), "refuse_traced_mb": round(traced / 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition per size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--refuse", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    if args.one:
        print(json.dumps(one(args.one, repeat)))
        return
    if args.refuse:
        print(json.dumps(refuse(repeat)))
        return
    out = subprocess.run([sys.executable, __file__, "--refuse", "--repeat", str(repeat)], check=True, capture_output=True, text=True)
    refused = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"refuse nodes: 100000000 on a 4-node partition: {refused['refuse_seconds'] * 1000:.1f} ms,"
        f" peak RSS {refused['refuse_peak_rss_mb']:.0f} MB (Python allocations during the refusal"
        f" {refused['refuse_traced_mb']} MB)"
    )
    rows = []
    for ranks in SIZES:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(ranks), "--repeat", str(repeat)],
            check=True,
            capture_output=True,
            text=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["us_per_rank"] = round(row["seconds"] / ranks * 1e6, 2)
        rows.append(row)
        print(
            f"{ranks:>7} ranks: plan {row['seconds']:.3f} s ({row['us_per_rank']:.2f} us/rank), "
            f"--json dump {row['json_seconds']:.3f} s ({row['json_mb']} MB), peak RSS {row['peak_rss_mb']:.0f} MB"
        )
    largest = rows[-1]
    small = rows[0]
    print(f"linearity: us/rank at {largest['ranks']} vs {small['ranks']}: {largest['us_per_rank'] / small['us_per_rank']:.2f}x")
    print(
        json.dumps(
            {
                "ranks": largest["ranks"],
                "seconds": largest["seconds"],
                "peak_rss_mb": largest["peak_rss_mb"],
                "refuse_seconds": refused["refuse_seconds"],
                "refuse_peak_rss_mb": refused["refuse_peak_rss_mb"],
            }
        )
    )


if __name__ == "__main__":
    main()
