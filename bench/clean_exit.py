"""Finished work is never repeated: a plain 40-step DDP script, run to its end again and again under load.

    .venv/bin/python bench/clean_exit.py [--quick] [--runs N] [--burners N] [--lab]

examples/own-script/train_ddp.py (it ends with `dist.destroy_process_group()`
while its DDP model is alive, as most tutorials do: the shape that deadlocked
gloo's destructor at exit) with STEPS=40, on 2 emulated nodes x 2 ranks of the
local backend (`--lab`: the Slurm test cluster), with CPU burners beside it so
the machine's load is 3 to 10. Each run must end `completed`, exit 0, in one
attempt, and leave no suspect; any other ending is counted and printed.

Last line: {"clean_runs_one_attempt": "k/N", "runs", "one_attempt", "failed",
"extra_attempts", "suspects", "run_s_p50", "run_s_max", "burners"}.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from precision import OWN, Lab, attempts, burners, suspects, wait_final

STEPS = 40


def one(lab: Lab) -> tuple[dict, int, float]:
    """Submit one run and wait for its end: its final state, its attempts and its seconds from submit."""
    began = time.monotonic()
    run = lab.submit(lab.spec("ddp40", ["python3", str(OWN / "train_ddp.py")], {"STEPS": str(STEPS)}))
    st = wait_final(run, 600)
    return st, len(attempts(run)), time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 runs (about a minute)")
    parser.add_argument("--runs", type=int, default=None, help="how many runs (20 unless --quick)")
    parser.add_argument("--burners", type=int, default=3, help="CPU burners beside the job")
    parser.add_argument("--lab", action="store_true", help="on the Slurm test cluster (SLURM_CONF must be set)")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 20)
    if args.lab and not os.environ.get("SLURM_CONF"):
        raise SystemExit("--lab needs SLURM_CONF (the Slurm test cluster's: tests/slurmlab/lab.sh)")
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    one_attempt = failed = extra = 0
    seconds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="clusterctl-clean-exit-") as tmp:
        scratch = Path(tmp)
        os.environ["CLUSTERCTL_LOCAL_STATE"] = str(scratch / "local-state")
        lab = Lab(scratch, "slurm-lab" if args.lab else "local", lambda text: print(text, flush=True))
        with burners(args.burners):
            for i in range(runs):
                st, count, took = one(lab)
                seconds.append(took)
                good = st.get("state") == "completed" and st.get("exit_code") == 0
                one_attempt += good and count == 1
                failed += not good
                extra += count - 1
                print(f"run {i + 1}/{runs}: {st.get('state')} (exit {st.get('exit_code')}) in {count} attempt(s),"
                      f" {took:.1f} s from submit", flush=True)
        blamed = suspects(lab)
    for s in blamed:
        print(f"  suspect: {s.get('node')}: {str(s.get('reason', ''))[:200]}")
    seconds.sort()
    print(json.dumps({
        "clean_runs_one_attempt": f"{one_attempt}/{runs}", "runs": runs, "one_attempt": one_attempt,
        "failed": failed, "extra_attempts": extra, "suspects": len(blamed),
        "run_s_p50": round(seconds[len(seconds) // 2], 1), "run_s_max": round(seconds[-1], 1),
        "burners": args.burners,
    }))


if __name__ == "__main__":
    main()
