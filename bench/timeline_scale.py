"""`report` and `trace` on a 16,384-rank run's timeline: the sample the watch server keeps, for an hour.

    .venv/bin/python bench/timeline_scale.py [--quick] [--minutes M]

Past 1,024 ranks the watch server records the phases and steps of 64 nodes
spread evenly (512 ranks at 8 GPUs a node) and every death, lost node and
verdict (docs/design/watchdog.md). scale_recovery.py measured that sample at
1.18 GB an hour at 16,384 ranks on 1 s steps. This bench writes a synthetic
run of 512 ranks (clusterctl/testing/runsynth.py: the watch server's line
layout, a straggler verdict and its restart) with as many steps as make the
measured bytes of M minutes (60; --quick: 10), then times `clusterctl
report --json` and `clusterctl trace` on it as a user runs them, each in its
own process: wall seconds and peak RSS (the largest process, its forked
timeline readers included, as the kernel counts them). Both read a bounded
number of bytes (the report 256 MB in stretches, the trace each attempt's
last 64 MB) and take deaths and verdicts from the marks file, so `--minutes`
longer than an hour costs no more. The timelines are left as the watch
server leaves them: closed every 128 MB (rundir/timeline.py's SEGMENT_BYTES)
and gzip-compressed, the last part live; `--whole` keeps each one file.
`timeline_mb` counts the timelines' bytes, `timeline_disk_mb` what they
take on disk.

Target (the scale issue): each under 10 s on a 16k-rank run's timeline.

Last line: {"ranks_in_detail", "run_minutes", "timeline_mb", "timeline_disk_mb", "segments",
"compress_cpu_s_per_segment", "compress_cores_16k" (the watch server's compression at 1.18 GB an hour),
"report_s", "report_peak_rss_mb", "trace_s", "trace_mb"}.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusterctl import rundir  # noqa: E402
from clusterctl.rundir import timeline  # noqa: E402
from clusterctl.testing.runsynth import write_synthetic_run  # noqa: E402

DETAIL_RANKS = 64 * 8  # the watch server's sample past 1,024 ranks: 64 nodes of 8
SAMPLE_BYTES_PER_HOUR = 1.18e9  # scale_recovery.py at 16,384 ranks, 1 s steps (bench/README.md)
CLUSTERCTL = str(Path(sys.executable).with_name("clusterctl"))


def bytes_per_rank_step(scratch: Path) -> float:
    """What runsynth writes for one rank's step, from a small run of the same shape."""
    run = write_synthetic_run(scratch / "calibrate", steps=200, ranks=DETAIL_RANKS, attempts=2, straggler=3)
    return sum(p.stat().st_size for p in run.glob("attempt-*/" + rundir.TIMELINE)) / (DETAIL_RANKS * 200)


def timed(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, the children's peak RSS in MB (the largest one process reached) and stdout."""
    began = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - began
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr[-500:]}")
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 minutes of the run (about a minute)")
    parser.add_argument("--minutes", type=float, default=None, help="minutes of the run (default 60; --quick 10)")
    parser.add_argument("--whole", action="store_true", help="each timeline one uncompressed file (runs before segments)")
    args = parser.parse_args()
    minutes = args.minutes or (10.0 if args.quick else 60.0)
    with tempfile.TemporaryDirectory(prefix="clusterctl-timeline-") as tmp:
        scratch = Path(tmp)
        per = bytes_per_rank_step(scratch)
        steps = max(20, round(SAMPLE_BYTES_PER_HOUR * minutes / 60 / (DETAIL_RANKS * per)))
        began = time.monotonic()
        run = write_synthetic_run(scratch / "runs", steps=steps, ranks=DETAIL_RANKS, attempts=2, straggler=3,
                                  segment_bytes=None if args.whole else timeline.SEGMENT_BYTES)
        paths = [p.parent / rundir.TIMELINE for p in run.glob("attempt-*/" + rundir.ATTEMPT_JSON)]
        written = sum(timeline.size(p) for p in paths)
        parts = [s for p in paths for s in timeline.segments(p)]
        disk = sum(s.path.stat().st_size for s in parts)
        print(f"{DETAIL_RANKS} ranks x {steps} steps: {written / 1e6:.0f} MB of timeline ({disk / 1e6:.0f} MB on disk in "
              f"{len(parts)} parts) written in {time.monotonic() - began:.1f} s", flush=True)
        compress_s = None
        if closed := [s for s in parts if s.compressed]:  # the watch server's thread compresses one such a segment
            copy = closed[0].path.with_name("copy." + closed[0].path.name[: -len(".gz")])
            with timeline.open_binary(closed[0].path.with_name(rundir.TIMELINE)) as fh, open(copy, "wb") as out:
                out.write(fh.read(closed[0].end - closed[0].start))
            cpu = time.process_time()
            timeline.compress(copy)
            compress_s = time.process_time() - cpu
            print(f"compressing a {closed[0].end - closed[0].start:,}-byte segment: {compress_s:.2f} s of CPU", flush=True)
        report_s, report_rss, _ = timed([CLUSTERCTL, "report", str(run), "--json"])
        print(f"report: {report_s:.2f} s, peak RSS {report_rss:.0f} MB", flush=True)
        trace_path = scratch / "trace.json"
        trace_s, _, _ = timed([CLUSTERCTL, "trace", str(run), "-o", str(trace_path)])
        trace_mb = trace_path.stat().st_size / 1e6
        print(f"trace: {trace_s:.2f} s, {trace_mb:.0f} MB", flush=True)
    print(json.dumps({"ranks_in_detail": DETAIL_RANKS, "run_minutes": minutes, "timeline_mb": round(written / 1e6, 1),
                      "timeline_disk_mb": round(disk / 1e6, 1), "segments": len(parts),
                      "compress_cpu_s_per_segment": compress_s and round(compress_s, 2),
                      "compress_cores_16k": compress_s and round(compress_s * SAMPLE_BYTES_PER_HOUR / timeline.SEGMENT_BYTES / 3600, 4),
                      "report_s": round(report_s, 2), "report_peak_rss_mb": round(report_rss, 1),
                      "trace_s": round(trace_s, 2), "trace_mb": round(trace_mb, 1)}))


if __name__ == "__main__":
    main()
