"""`clusterctl trace`: run directories (hand-written, and a real one when present) to Chrome trace JSON."""

from __future__ import annotations

import json
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir
from clusterctl.rundir import timeline as timelinefile
from clusterctl.views.chrometrace import build_trace, write_trace
from tests.helpers import cli

# A recorded run (the quickstart trainer, rank 1 killed at about step 120, restarted in the allocation), checkpoints left out.
REAL_RUN = Path(__file__).resolve().parent / "fixtures" / "run-killed-rank.tar.gz"
T0 = 1796097129  # attempt 1 starts (whole seconds, as the batch script writes them)
HOSTS = ["node1", "node2"]
PHASES = ("forward", "backward", "optimizer", "collective")


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _ranks(attempt: int) -> list[dict[str, Any]]:
    return [
        {"rank": r, "host": HOSTS[r // 2], "gpu": r % 2, "local_rank": r % 2, "attempt": attempt, "timings": {"started": T0 + 20 * (attempt - 1) + 1.5, "torch_imported": T0 + 20 * (attempt - 1) + 3.0}}
        for r in range(4)
    ]


def _timeline(attempt: int, steps: int, start: float, kill: int | None = None, with_at: bool = True) -> list[dict[str, Any]]:
    """Phases for 4 ranks, a step record per step, one GPU sample per node; `kill` dies after step 1, the rest go."""
    lines: list[dict[str, Any]] = []
    for node in HOSTS:
        lines.append({"t": start, "kind": "gpu", "node": node, "gpus": {"0": {"temperature_c": 60, "slowdown": ["hw"]}, "1": {"temperature_c": 61}}})
    end = start
    for rank in range(4):
        at = start + 0.001 * rank
        for step in range(steps):
            if kill == rank and step == 2:
                break
            begun = at
            for phase in PHASES:
                lines.append({"t": at + 0.2, "kind": "phase", "rank": rank, "node": HOSTS[rank // 2], "step": step, "phase": phase, "at": at})
                at += 0.01
            lines.append({"t": at + 0.2, "kind": "step", "rank": rank, "node": HOSTS[rank // 2], "step": step, "phase": "collective", "at": at, "step_s": at - begun, "compute_s": 0.02})
            lines.append({"t": at + 0.2, "kind": "phase", "rank": rank, "node": HOSTS[rank // 2], "step": step, "phase": "idle", "at": at + 0.001})
            at += 0.002
        gone = at + (0.0 if kill == rank else 1.0)
        lines.append({"t": gone + 0.001, "kind": "gone", "rank": rank, "node": HOSTS[rank // 2], "pid": 100 + rank, "at": gone})
        end = max(end, gone)
    if not with_at:
        for line in lines:
            line.pop("at", None)
    if kill is not None:
        lines.append({"t": end + 0.05, "kind": "node_lost", "node": "node2"})
    return lines


def make_run(root: Path, name: str = "demo-run", with_at: bool = True) -> RunDir:
    """Two attempts on two nodes: rank 1 dies in attempt 1, the run restarts in the allocation and finishes."""
    path = root / name
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"job_id": "3", "backend": "local"}))
    culprit = {"rank": 1, "host": "node1", "gpu": 1, "reason": "killed by a signal (Killed) before any peer failed"}
    verdicts = {
        1: {"code": 84, "verdict": "script_failed", "message": "rank 1 on node1 failed: killed", "culprits": [culprit], "victims": [{"rank": 0}], "time": T0 + 15.3, "ok": False},
        2: {"code": 0, "verdict": "ok", "message": "all 4 ranks registered and checked", "culprits": [], "victims": [], "time": T0 + 22.0, "ok": True},
    }
    for attempt, begin, kill in ((1, T0 + 10.0, 1), (2, T0 + 30.0, None)):
        directory = path / f"attempt-{attempt}"
        directory.mkdir()
        started = T0 if attempt == 1 else T0 + 18
        (directory / "attempt.json").write_text(json.dumps({"job_id": "3", "attempt": attempt, "hosts": HOSTS, "started": started}))
        (directory / "manifest.json").write_text(json.dumps({"attempt": attempt, "hosts": HOSTS, "ranks": _ranks(attempt), "world_size": 4}))
        (directory / "verdict.json").write_text(json.dumps(verdicts[attempt]))
        _write_jsonl(directory / "timeline.jsonl", _timeline(attempt, 3, begin, kill, with_at))
    _write_jsonl(path / "attempts.jsonl", [
        {"event": "start", "attempt": 1, "job_id": "3", "time": T0, "nodes": 2},
        {"event": "end", "attempt": 1, "job_id": "3", "exit": 84, "time": T0 + 15},
        {"event": "next", "how": "allocation", "attempt": 1, "job_id": "3", "exit": 84, "reason": "restarting in the allocation", "time": T0 + 15},
        {"event": "start", "attempt": 2, "job_id": "3", "time": T0 + 18, "nodes": 2},
        {"event": "end", "attempt": 2, "job_id": "3", "exit": 0, "time": T0 + 35},
        {"event": "next", "how": "stop", "attempt": 2, "job_id": "3", "exit": 0, "reason": "training finished", "time": T0 + 35},
    ])
    return RunDir(path)


def _strict(text: str) -> dict[str, Any]:
    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def render(run: RunDir, attempt: int | None = None, **options: Any) -> dict[str, Any]:
    out = Path(run.path.parent / f"trace-{attempt}.json")
    with open(out, "w") as fh:
        write_trace(build_trace(run, attempt, **options), fh)
    return _strict(out.read_text())


def check_trace(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event well-formed, every pid/tid named, slices per thread never overlapping unless nested."""
    assert doc["displayTimeUnit"] == "ms"
    assert isinstance(doc["otherData"]["origin_epoch_s"], (int, float))
    events = doc["traceEvents"]
    processes, threads, used_pids, used_threads = set(), set(), set(), set()
    for e in events:
        assert e["ph"] in {"X", "i", "M", "C"}, e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["args"], dict), e
        if e["ph"] == "M":
            assert e["name"] in {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}, e
            if e["name"] == "process_name":
                processes.add(e["pid"])
            if e["name"] == "thread_name":
                threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        used_pids.add(e["pid"])
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert e["cat"] in {"phase", "step", "startup"}, e
            used_threads.add((e["pid"], e["tid"]))
        elif e["ph"] == "i":
            assert e["s"] in {"g", "p", "t"}, e
            if e["s"] == "t":
                used_threads.add((e["pid"], e["tid"]))
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in e["args"].values()), e
    assert used_pids <= processes, used_pids - processes
    assert used_threads <= threads, used_threads - threads
    lanes: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane, slices in lanes.items():
        level = [s for s in slices if s["cat"] != "step"]
        level.sort(key=lambda s: s["ts"])
        for a, b in zip(level, level[1:]):
            assert a["ts"] + a["dur"] <= b["ts"], f"{lane}: {a} overlaps {b}"
        steps = sorted((s for s in slices if s["cat"] == "step"), key=lambda s: s["ts"])
        for a, b in zip(steps, steps[1:]):
            assert a["ts"] + a["dur"] <= b["ts"], f"{lane}: {a} overlaps {b}"
        for phase in level:  # a phase is inside a step or outside every step, never across a step's edge
            for step in steps:
                inside = step["ts"] <= phase["ts"] and phase["ts"] + phase["dur"] <= step["ts"] + step["dur"]
                apart = phase["ts"] + phase["dur"] <= step["ts"] or step["ts"] + step["dur"] <= phase["ts"]
                assert inside or apart, f"{lane}: {phase} crosses {step}"
    return events


def _named(events: list[dict[str, Any]], kind: str) -> dict[int, str]:
    return {e["pid"] if kind == "process_name" else (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == kind}


def _instant(events: list[dict[str, Any]], name: str, pids: range = range(0, 1 << 30)) -> dict[str, Any]:
    found = [e for e in events if e["ph"] == "i" and e["name"] == name and e["pid"] in pids]
    assert len(found) == 1, (name, [e["name"] for e in events if e["ph"] == "i"])
    return found[0]


def test_two_attempts_on_one_axis(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    doc = render(run)
    events = check_trace(doc)
    other = doc["otherData"]
    assert other["attempts"] == [1, 2] and other["origin_epoch_s"] == T0
    assert other["ranks"] == 4 and other["nodes"] == 2 and other["skipped_lines"] == 0 and other["clamped_to_origin"] == 0
    processes = _named(events, "process_name")
    assert processes == {0: "node1 (attempt 1)", 1: "node2 (attempt 1)", 1000: "node1 (attempt 2)", 1001: "node2 (attempt 2)"}
    threads = _named(events, "thread_name")
    for base in (0, 1000):  # every rank of each manifest has its thread, on its node, with its GPU
        for r in range(4):
            assert threads[(base + r // 2, r)] == f"rank {r} (GPU {r % 2})"

    # a phase lasts from its `at` to the rank's next phase record, in microseconds from the origin
    first = next(e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 0 and e["cat"] == "phase")
    assert (first["name"], first["ts"], first["dur"], first["args"]) == ("forward", 10_000_000, 10_000, {"step": 0})
    step0 = next(e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 0 and e["name"] == "step 0")
    assert step0["ts"] == 10_000_000 and step0["dur"] == 42_000 and step0["args"]["compute_s"] == 0.02
    startup = next(e for e in events if e.get("cat") == "startup" and e["pid"] == 0 and e["tid"] == 0)
    assert (startup["ts"], startup["ts"] + startup["dur"]) == (1_500_000, 10_000_000)
    assert startup["args"]["after_s"] == {"torch_imported": 1.5}

    verdict = _instant(events, "verdict script_failed (code 84)")
    assert verdict["s"] == "g" and "rank 1 on node1" in verdict["args"]["culprits"][0]
    assert verdict["args"]["message"] == "rank 1 on node1 failed: killed"
    gone = _instant(events, "rank 1 gone", range(1000))
    assert (gone["s"], gone["pid"], gone["tid"]) == ("t", 0, 1)
    lost = _instant(events, "node node2 lost")
    assert (lost["s"], lost["pid"]) == ("p", 1)
    # rank 1's last phase ends where it died; nothing of rank 1 after that in attempt 1
    rank1 = [e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 1]
    assert max(e["ts"] + e["dur"] for e in rank1) == gone["ts"]

    end1 = _instant(events, "attempt 1 end (exit 84)")
    restart = _instant(events, "restart in the allocation")
    start2 = _instant(events, "attempt 2 start")
    attempt1 = [e["ts"] + e.get("dur", 0) for e in events if e["ph"] in "XC" and e["pid"] < 1000]
    attempt2 = [e["ts"] for e in events if e["ph"] in "XC" and e["pid"] >= 1000]
    assert max(attempt1) <= end1["ts"] <= restart["ts"] <= start2["ts"] <= min(attempt2)
    assert restart["args"]["reason"] == "restarting in the allocation"
    assert _instant(events, "run stops")["ts"] >= max(e["ts"] + e.get("dur", 0) for e in events if e["ph"] == "X")
    counters = [e for e in events if e["ph"] == "C"]
    assert {(e["pid"], e["name"]) for e in counters} == {(p, f"gpu {g}") for p in (0, 1, 1000, 1001) for g in (0, 1)}
    assert all("slowdown" not in e["args"] for e in counters)


def test_one_attempt_uses_slots_as_pids(tmp_path: Path) -> None:
    events = check_trace(render(make_run(tmp_path), attempt=2))
    assert _named(events, "process_name") == {0: "node1 (attempt 2)", 1: "node2 (attempt 2)"}
    assert not any(e["ph"] == "i" and "attempt 1" in e["name"] for e in events)
    assert _instant(events, "attempt 2 start")["ts"] == 0


def test_without_at_phases_use_the_receive_time(tmp_path: Path) -> None:
    """Older runs: no `at`; the controller's `t` places the phases."""
    events = check_trace(render(make_run(tmp_path, with_at=False)))
    first = next(e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 0 and e["cat"] == "phase")
    assert (first["ts"], first["dur"]) == (10_200_000, 10_000)


def test_no_steps_leaves_phases_only(tmp_path: Path) -> None:
    events = check_trace(render(make_run(tmp_path), steps=False, gpu=False))
    assert not [e for e in events if e.get("cat") == "step" or e["ph"] == "C"]
    assert [e for e in events if e.get("cat") == "phase"]


def test_last_phase_ends_with_the_attempt(tmp_path: Path) -> None:
    """No `gone` record (the controller died first): the open phase runs to the attempt's end."""
    run = make_run(tmp_path)
    timeline = run.attempt(2) / "timeline.jsonl"
    kept = [line for line in timeline.read_text().splitlines() if '"gone"' not in line]
    timeline.write_text("\n".join(kept) + "\n")
    events = check_trace(render(run, attempt=2))
    end = _instant(events, "attempt 2 end (exit 0)")
    for rank in range(4):
        lane = [e for e in events if e["ph"] == "X" and e["tid"] == rank]
        assert max(e["ts"] + e["dur"] for e in lane) == end["ts"]


def test_hostile_lines_are_skipped(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    with open(run.attempt(1) / "timeline.jsonl", "a") as fh:
        fh.write('{"t": 1, "kind": "phase", "rank": 0, "phase": "forw\n')  # torn
        fh.write("[1, 2]\n\n")
        fh.write('{"t": NaN, "kind": "phase", "rank": 0, "phase": "x"}\n')
        fh.write('{"t": 1796097150.0, "kind": "phase", "rank": "zero", "phase": "x"}\n')
        fh.write('{"t": 1796097150.0, "kind": "gpu", "node": "node9", "gpus": {"0": {"temperature_c": Infinity, "power_w": 300}}}\n')
        fh.write('{"t": 1796097150.0, "kind": "phase", "rank": 7, "node": "node3", "step": {"a": 1}, "phase": ["x"], "at": 1796097150.0}\n')
    doc = render(run)
    events = check_trace(doc)
    assert doc["otherData"]["skipped_lines"] == 5
    assert _named(events, "thread_name")[(3, 7)] == "rank 7"  # a rank the manifest lacks still gets a thread
    assert _named(events, "process_name")[2] == "node9 (attempt 1)"


def test_run_failed_in_preflight_has_attempt_events_only(tmp_path: Path) -> None:
    path = tmp_path / "early"
    (path / "attempt-1").mkdir(parents=True)
    (path / "state.json").write_text("{}")
    (path / "attempt-1" / "attempt.json").write_text(json.dumps({"attempt": 1, "hosts": HOSTS, "started": T0}))
    _write_jsonl(path / "attempts.jsonl", [
        {"event": "start", "attempt": 1, "job_id": "9", "time": T0},
        {"event": "end", "attempt": 1, "job_id": "9", "exit": 81, "time": T0 + 4},
        {"event": "next", "how": "stop", "attempt": 1, "job_id": "9", "exit": 81, "reason": "preflight failed", "time": T0 + 4},
    ])
    events = check_trace(render(RunDir(path)))
    assert [e["name"] for e in events if e["ph"] != "M"] == ["attempt 1 start", "attempt 1 end (exit 81)", "run stops"]
    assert [e["ts"] for e in events if e["ph"] != "M"] == [0, 4_000_000, 4_000_000]


def test_a_run_without_attempts_is_an_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "pending"
    path.mkdir()
    (path / "state.json").write_text("{}")
    doc = render(RunDir(path))
    assert doc["traceEvents"] == [] and doc["otherData"]["events"] == 0


def test_unknown_attempt_names_the_ones_that_exist(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    with pytest.raises(ClusterctlError) as caught:
        build_trace(run, 7)
    assert caught.value.exit_code == ExitCode.USAGE
    result = cli("trace", run.path, "--attempt", "7", "-o", tmp_path / "t.json")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "no attempt 7" in result.stderr and "attempts: 1, 2" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "t.json").exists()


def test_cli_writes_file_or_stdout(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    out = tmp_path / "out" / "trace.json"
    out.parent.mkdir()
    result = cli("trace", run.path, "-o", out)
    assert result.exit_code == 0, result.output
    written = check_trace(_strict(out.read_text()))
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith(f"trace: {len(written):,} events, 4 ranks, 2 nodes, 2 attempts, span ")
    result = cli("trace", run.path, "--attempt", "1", "-o", "-")
    assert result.exit_code == 0, result.output
    assert check_trace(_strict(result.stdout))
    assert "attempt 1" in result.stderr
    missing = cli("trace", run.path, "-o", tmp_path / "nowhere" / "t.json")
    assert missing.exit_code == ExitCode.USAGE and "no directory" in missing.stderr
    for args, name in (((), "trace.json"), (("--attempt", "2"), "trace-attempt-2.json")):  # where report writes too
        result = cli("trace", run.path, *args)
        assert result.exit_code == 0 and check_trace(_strict((run.path / name).read_text())), result.output
        assert str(run.path / name) in result.stderr


def test_memory_stays_bounded_while_streaming(tmp_path: Path) -> None:
    """A long timeline is read in one pass: memory grows with the ranks, not with the lines."""
    run = make_run(tmp_path)
    timeline = run.attempt(2) / "timeline.jsonl"
    with open(timeline, "w") as fh:
        at = T0 + 30.0
        for step in range(3000):
            for rank in range(4):
                for phase in PHASES:
                    fh.write(json.dumps({"t": at, "kind": "phase", "rank": rank, "node": HOSTS[rank // 2], "step": step, "phase": phase, "at": at}) + "\n")
                    at += 0.001
    trace = build_trace(run, 2)
    tracemalloc.start()
    try:
        count = 0
        for batch in trace.batches():
            count += len(batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count > 3000 * 4 * 5
    assert peak < 8 * 1024 * 1024, peak


def test_real_run(tmp_path: Path) -> None:
    with tarfile.open(REAL_RUN) as tar:
        tar.extractall(tmp_path, filter="data")
    (copy,) = tmp_path.iterdir()
    events = check_trace(render(RunDir(copy)))
    manifest = json.loads((copy / "attempt-1" / "manifest.json").read_text())
    threads = _named(events, "thread_name")
    for base in (0, 1000):
        for record in manifest["ranks"]:
            assert (base + HOSTS.index(record["host"]), record["rank"]) in threads
    verdict = next(e for e in events if e["ph"] == "i" and e["name"].startswith("verdict script_failed"))
    assert any(c.startswith("rank 1 on node1") for c in verdict["args"]["culprits"])
    restart = _instant(events, "restart in the allocation")
    last1 = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X" and e["pid"] < 1000)
    first2 = min(e["ts"] for e in events if e["ph"] == "X" and e["pid"] >= 1000)
    assert last1 <= restart["ts"] <= _instant(events, "attempt 2 start")["ts"] <= first2


def test_a_timeline_too_large_to_trace_whole_shows_its_end_and_every_death(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the trace's budget an attempt shows the minutes before its end; a death long before is still there,
    otherData and the summary line say where the window starts, and --all writes everything."""
    run = make_run(tmp_path)
    timeline = run.attempt(2) / "timeline.jsonl"
    at, steps = T0 + 30.0, 1200
    with open(timeline, "w") as fh:
        for step in range(steps):
            for rank in range(4 if step < 60 else 3):
                for phase in PHASES:
                    fh.write(json.dumps({"t": at, "kind": "phase", "rank": rank, "node": HOSTS[rank // 2], "step": step,
                                         "phase": phase, "at": at}) + "\n")
                    at += 0.001
            if step == 59:  # rank 3 ends early in the file: its death must show whatever the window
                fh.write(json.dumps({"t": at, "kind": "gone", "rank": 3, "node": HOSTS[1], "pid": 103, "at": at}) + "\n")
    size = timeline.stat().st_size
    monkeypatch.setattr("clusterctl.views.tracewindow.TRACE_BYTES", size // 4)
    searched = check_trace(render(run, 2))  # no marks file (a run written before it): the bytes before are searched
    assert _instant(searched, "rank 3 gone")
    marks = timeline.with_name("timeline-marks.jsonl")
    data = timeline.read_bytes()
    offset = data.rfind(b"\n", 0, data.index(b'"kind": "gone"')) + 1
    died = json.loads(data[offset:data.index(b"\n", offset)])
    marks.write_text(json.dumps({"offset": offset, **died, "pid": 999}) + "\n")  # as the writer keeps it (another pid)
    doc = render(run, 2)
    events = check_trace(doc)
    window = doc["otherData"]["window"]["2"]
    assert window["of_bytes"] == size and 0.7 * size < window["from_byte"] < 0.8 * size, window
    phases = [e for e in events if e["ph"] == "X" and e["cat"] == "phase"]
    first_step = min(e["args"]["step"] for e in phases)
    shown = {e["tid"] for e in phases}
    assert shown == {0, 1, 2}, shown
    gone = _instant(events, "rank 3 gone")
    assert gone["ts"] < min(e["ts"] for e in phases) and gone["args"]["pid"] == 999, gone  # read from the marks file
    assert first_step > 0.6 * steps, first_step
    result = cli("trace", run.path, "--attempt", "2", "-o", "-")
    assert result.exit_code == 0 and "--all" in result.stderr and "attempt 2: its last" in result.stderr, result.stderr
    whole = check_trace(render(run, 2, whole=True))
    assert len([e for e in whole if e["ph"] == "X" and e["cat"] == "phase"]) > 3 * len(phases)
    assert len(timelinefile.split(timeline, size // 7)) >= 6  # the same timeline in compressed segments: the same trace
    cut = render(run, 2)
    assert (cut["traceEvents"], cut["otherData"]["window"]["2"]) == (doc["traceEvents"], window)
    assert render(run, 2, whole=True)["traceEvents"] == whole
