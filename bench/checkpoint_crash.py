"""Crash drill of the checkpoint commit protocol: 1,000 killed saves.

    python bench/checkpoint_crash.py [--quick] [--trials N] [--ranks 2] [--seed S] [--dir PATH]

Each trial forks the ranks from this process (torch imported once), resumes
from the newest committed generation and saves three more steps (sync and
async mixed) into one shared directory, and kills every rank with SIGKILL
either when one enters a chosen phase of the save (shard write, shard fsync,
DCP metadata, manifest write/fsync, directory fsync, rename, parent fsync,
retention, cleanup of stale temporaries) or after a random delay. After each
trial, `latest_committed` must be the newest generation whose rename
happened, verify (sizes, crc32) and load bit for bit as the state and
per-rank extras of its step, and no committed name may be torn.
`--dir` runs it on another file system (e.g. the cluster's shared one).

Last line: {"trials", "phases_hit", "phases_missed", "failures", "seconds"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402,F401 - imported once here, inherited by every forked rank

from clusterctl.testing import crashdrill as drill  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 trials (under a minute)")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    trials = args.trials or (100 if args.quick else 1000)
    with tempfile.TemporaryDirectory(prefix="ckpt-drill-", dir=args.dir) as tmp:
        report = drill.run(Path(tmp), trials, seed=args.seed, world_size=args.ranks)
    for failure in report.failures[:20]:
        print("FAILURE", failure)
    summary = report.summary()
    print(f"{summary['trials']} killed trials ({summary['unkilled_runs']} runs whose kill point was not reached), "
          f"{summary['failures']} failures, {summary['seconds']} s")
    for phase, count in summary["phases_hit"].items():
        print(f"  {phase:16s} {count}")
    print(json.dumps({k: summary[k] for k in ("trials", "phases_hit", "phases_missed", "failures", "seconds")}))
    return 1 if report.failures or summary["phases_missed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
