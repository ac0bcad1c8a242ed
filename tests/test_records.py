"""The run directory's records, one definition each: writers and readers agree, old run directories still read.

run.json, attempt.json, verdict.json, timeline.jsonl lines and metrics lines
each have one module (clusterctl/rundir/). The report reads millions of
timeline and metrics lines with patterns built from those definitions; here
the lines the writers make (and the synthetic runs the benchmarks use) must
match them, and a run directory recorded before the definitions existed
must read through every one of them.
"""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import pytest

from clusterctl.rundir import RunDir, attemptjson, history, metrics, runjson, timeline
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.runjson import RunJson
from clusterctl.rundir.verdict import Verdict
from clusterctl.testing import runsynth
from clusterctl.views.report import load
from clusterctl.views.report import timeline as report_timeline

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "run-killed-rank.tar.gz"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """A real run directory written before the records had definitions (rank 1 killed, restart in the allocation)."""
    root = tmp_path_factory.mktemp("recorded")
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(root, filter="data")
    (path,) = root.iterdir()
    return RunDir(path)


def test_a_run_directory_of_the_previous_format_reads_through_every_record(recorded: RunDir) -> None:
    plan = runjson.read(recorded.path)
    assert plan is not None and plan.version == 1 and (plan.world_size, plan.gpus_per_node, plan.nodes) == (4, 2, 2)
    assert plan.parallel.dp == 4 and plan.checkpoint_dir(recorded.path) == recorded.checkpoints
    first = attemptjson.read(recorded.attempt(1))
    assert first is not None and (first.format, first.job_id, first.hosts) == (1, "5", ("node1", "node2"))
    blamed = verdictfile.read(recorded.attempt(1))
    assert blamed is not None and not blamed.ok and blamed.code == 84 and blamed.culprit_hosts() == ["node1"]
    kinds = {r["kind"] for r in timeline.read(recorded.attempt(2) / "timeline.jsonl")}
    assert {"phase", "step", "gone"} <= kinds
    steps = metrics.read_all(recorded.attempt(2) / "metrics.jsonl")
    assert steps[0]["step"] == 100 and steps[-1]["step"] == 199
    told = history.read(recorded)
    assert [(a.number, a.exit_code, a.next) for a in told.attempts] == [(1, 84, "allocation"), (2, 0, "stop")]


def test_run_json_round_trips_and_reads_what_it_does_not_know(tmp_path: Path) -> None:
    plan = RunJson(name="x", world_size=8, gpus_per_node=4, exclude=("n1",),
                   parallel=runjson.Parallel(tp=2, dp=4), checkpoint=runjson.CheckpointRecord(dir="/ck", async_=True))
    data = plan.to_dict()
    assert data["checkpoint"]["async"] is True and data["batch"]["global"] == 1 and data["version"] == runjson.VERSION
    assert RunJson.from_dict(json.loads(json.dumps(data))) == plan
    newer = {**data, "a_key_from_a_later_version": 1, "parallel": {**data["parallel"], "zz": 3}}
    assert RunJson.from_dict(newer) == plan
    assert RunJson.from_dict({"name": "old"}).watchdog.hang_timeout == 120.0  # a missing section: its defaults
    (tmp_path / "run.json").write_text(plan.to_json())
    assert runjson.read(tmp_path) == plan and runjson.read(tmp_path / "nowhere") is None


def test_verdict_json_keeps_the_documented_keys(tmp_path: Path) -> None:
    given = Verdict(False, 82, "rank 3 on n2 hung", [{"rank": 3, "host": "n2", "reason": "no progress"}],
                    {"stacks": {}}, [{"rank": 0, "host": "n1", "reason": "waiting"}], time=5.0)
    verdictfile.write(tmp_path, given)
    text = (tmp_path / "verdict.json").read_text()
    data = json.loads(text)
    assert {"ok", "code", "verdict", "message", "culprits", "victims", "evidence", "time", "format"} <= set(data)
    assert data["verdict"] == "hang" and '"ok": false' in text  # the batch script greps for this
    assert verdictfile.read(tmp_path) == given


def test_the_timeline_writers_lines_match_the_reports_patterns(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    writer = timeline.TimelineWriter(path)
    writer.write(timeline.PHASE, 1.5, rank=3, node="node2", step=7, phase="forward", at=1.25, step_s=9.0)
    writer.write(timeline.STEP, 2.5, rank=3, node="node2", step=7, phase="collective", at=2.25, step_s=0.5, compute_s=0.25)
    writer.write(timeline.GONE, 3.5, rank=3, node="node2", pid=77, at=3.25)
    writer.close()
    phase, step, gone = path.read_bytes().splitlines()
    assert json.loads(phase)["format"] == timeline.FORMAT and "format" not in json.loads(step)  # the first record says it
    assert list(json.loads(phase)) == list(timeline.LAYOUT["phase"])  # step_s is no phase key
    assert report_timeline._PHASE.findall(phase) == [(b"3", b"forward", b"1.25")]
    assert report_timeline._STEP.findall(step) == [(b"3", b"7", b"0.5", b"0.25")]  # compute_s too: the heatmap colours it
    assert list(json.loads(gone)) == list(timeline.LAYOUT["gone"])[:-1]
    no_at = json.dumps(timeline.record(timeline.PHASE, 1.5, rank=3, node="n", step=7, phase="idle")).encode()
    assert report_timeline._PHASE_NO_AT.findall(no_at) == [(b"1.5", b"3", b"idle")]


def test_the_marks_file_holds_every_death_lost_node_and_verdict_with_its_offset_in_the_timeline(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    writer = timeline.TimelineWriter(path)
    writer.write(timeline.PHASE, 1.5, rank=3, node="nöde2", step=7, phase="forward", at=1.25)
    writer.write(timeline.GONE, 3.5, rank=3, node="nöde2", pid=77, at=3.25)
    writer.write(timeline.GPU, 3.6, node="n1", gpus={"0": {"temp": 50}})
    writer.write(timeline.NODE_LOST, 3.7, node="n1")
    writer.close()
    writer = timeline.TimelineWriter(path)  # the next writer of the same attempt (a restarted watch server) appends
    writer.write(timeline.VERDICT, 4.0, code=82, message="hang: rank 3 …")
    writer.close()
    marked = timeline.marks(path)
    assert [rec["kind"] for _, rec in marked] == ["gone", "node_lost", "verdict"]
    data = path.read_bytes()
    for offset, rec in marked:
        assert json.loads(data[offset:data.index(b"\n", offset)]) == rec
    assert timeline.marks(tmp_path / "older" / "timeline.jsonl") is None  # a run written before the marks file


def test_the_metrics_writers_lines_match_the_reports_pattern(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = metrics.MetricsWriter(path)
    record = {"step": 4, "loss": 2.5, "loss_hex": float.hex(2.5), "step_s": 0.1, "compute_s": 0.05, "tokens_per_s": 99.0,
              "t": 10.5, "train_s": 0.5, "total_steps": 9, "data_s": 0.01, "epoch": 0, "val_loss": 2.4, "mine": "kept"}
    writer.write(dict(reversed(list(record.items()))))  # any order in: FIELDS order out, the writer's own keys last
    writer.write({k: record[k] for k in ("step", "loss", "step_s", "compute_s", "tokens_per_s")})
    writer.close()
    lines = path.read_bytes().splitlines()
    assert json.loads(lines[0])["format"] == metrics.FORMAT and "format" not in json.loads(lines[1])  # the first line says it
    assert list(json.loads(lines[0])) == [*(k for k in metrics.FIELDS if k in record), "format", "mine"]
    assert load._METRIC.findall(lines[1]) == [(b"4", b"2.5", b"0.1", b"99.0", b"", b"")]
    assert not load._METRIC.findall(lines[0])  # a key it does not know: the reader takes json.loads for the file
    read = load.read_metrics(path, None)
    assert list(read.step) == [4, 4] and read.val_loss[0] == 2.4
    assert [r["step"] for r in metrics.read_all(path)] == [4, 4] and metrics.MetricsFile(path).first()["step"] == 4


def test_a_synthetic_run_is_laid_out_as_the_real_writers_lay_out_theirs(tmp_path: Path) -> None:
    path = runsynth.write_synthetic_run(tmp_path, 40, ranks=4, attempts=2, seed=1, name="s", eval_interval=10)
    for n in (1, 2):
        adir = RunDir(path).attempt(n)
        for raw in (adir / "timeline.jsonl").read_bytes().splitlines():
            rec = json.loads(raw)
            assert list(rec) == [k for k in timeline.LAYOUT[rec["kind"]] if k != "format"]
        lines = (adir / "metrics.jsonl").read_bytes().splitlines()
        assert lines and all(list(json.loads(line)) == [k for k in metrics.FIELDS if k in json.loads(line)] for line in lines)
        assert len(load._METRIC.findall(b"\n".join(lines))) == len(lines)
    assert runjson.read(path) is not None and len(history.read(RunDir(path)).attempts) == 2


def _written(path: Path, count: int) -> None:
    """`count` records through the writer, its segments 20 kB, a death every 97th."""
    writer = timeline.TimelineWriter(path, segment_bytes=20_000)
    for i in range(count):
        if i % 97 == 0:
            writer.write(timeline.GONE, 10.0 + i, rank=i % 8, node="node1", pid=100 + i, at=9.5 + i)
        else:
            writer.write(timeline.PHASE, 10.0 + i, rank=i % 8, node=f"node{i % 4}", step=i // 8, phase="forward", at=9.5 + i)
    writer.close(wait_s=60)


def test_a_long_timeline_is_cut_into_compressed_segments_and_read_as_one_file(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its segment size the live file is closed, gzip-compressed beside it and removed; every reader sees the
    same records at the same offsets as in one uncompressed file, and any gzip tool reads a segment."""
    monkeypatch.setattr(timeline, "MEMBER_BYTES", 4096)  # several members a segment: reads seek to one of them
    path = tmp_path / "timeline.jsonl"
    _written(path, 3000)
    parts = timeline.segments(path)
    closed = [p for p in parts if p.end >= 0]
    assert len(closed) >= 5 and all(p.compressed for p in closed) and parts[-1].path == path, parts
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".jsonl")) and p.name.count(".") > 1]
    whole = b"".join(gzip.decompress(p.path.read_bytes()) for p in closed) + path.read_bytes()
    assert timeline.size(path) == len(whole)
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir() if p.name.startswith("timeline."))
    assert on_disk < len(whole) / 3, (on_disk, len(whole))
    records = list(timeline.read(path))
    assert [r["t"] for r in records] == [10.0 + i for i in range(3000)] and records[0]["format"] == timeline.FORMAT
    marked = timeline.marks(path)
    assert [rec["pid"] for _, rec in marked] == [100 + i for i in range(0, 3000, 97)]
    with timeline.open_binary(path) as fh:
        for offset, rec in marked:  # offsets count in the whole timeline
            fh.seek(offset)
            assert json.loads(fh.readline()) == rec
        for start in range(0, len(whole), 3331):  # any stretch, across segments and members
            fh.seek(start)
            assert fh.read(9000) == whole[start:start + 9000]
    since, end = timeline.tail(path, marked[2][0])
    assert since[0]["pid"] == marked[2][1]["pid"] and since[-1]["t"] == 10.0 + 2999 and end == len(whole)


def test_a_compression_cut_short_leaves_one_whole_copy_read_once(tmp_path: Path) -> None:
    """Killed while compressing: a partial .gz.tmp is ignored; renamed but the original not yet removed: the
    compressed copy is read, not both."""
    path = tmp_path / "timeline.jsonl"
    _written(path, 600)
    expected = list(timeline.read(path))
    first = timeline.segments(path)[0]
    plain = first.path.with_name(first.path.name[: -len(".gz")])
    plain.write_bytes(gzip.decompress(first.path.read_bytes()))  # the original still beside its copy
    assert list(timeline.read(path)) == expected
    first.path.rename(first.path.with_name(first.path.name + ".tmp"))  # the copy only half written
    assert list(timeline.read(path)) == expected
    moved = tmp_path / "copy" / "timeline.jsonl"
    moved.parent.mkdir()
    moved.write_bytes(b"".join(line.encode() for line in (json.dumps(r) + "\n" for r in expected)))
    assert timeline.split(moved, 5_000) and list(timeline.read(moved)) == expected  # a timeline written whole, cut
