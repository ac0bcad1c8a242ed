"""`clusterctl report` as a user meets it: the page and its plots, the figures, runs with little or odd data."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import cli

from clusterctl.rundir import RunDir
from clusterctl.rundir import timeline as timelinefile
from clusterctl.testing.runsynth import STRAGGLER_FACTOR, write_synthetic_run
from clusterctl.views.report import build_report, collect
from clusterctl.views.report.load import read_metrics
from clusterctl.views.report.plots import FILES
from clusterctl.views.report.stats import WARMUP_STEPS
from clusterctl.views.report.timeline import CATEGORIES, read_timeline


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_run(tmp_path_factory.mktemp("runs"), steps=400, ranks=4, attempts=2, straggler=2)


@pytest.fixture(scope="module")
def built(straggler_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("report")
    return out, build_report(RunDir(straggler_run), out)


def test_page_references_every_plot_and_names_the_culprit(built: tuple[Path, dict[str, Any]]) -> None:
    out, head = built
    page = (out / "index.html").read_text()
    for name in FILES:
        width, height = png_size(out / name)
        assert 600 <= width <= 2000 and 150 <= height <= 1400, (name, width, height)
        assert (out / name).stat().st_size > 5000, name
        assert f'src="{name}"' in page
    assert "rank 2 on node2" in page  # the first attempt's straggler verdict
    assert "http" not in page.split("<body>")[0]  # nothing fetched from the net
    p50 = head["step_time_s"]["2"]["p50"]
    assert str(p50) in page
    assert head["slowest_rank"]["rank"] == 2


def _expected_steady(run: Path) -> dict[int, list[float]]:
    """Per rank, the steady step times read the slow, obvious way."""
    steady: dict[int, list[float]] = {}
    for adir in sorted(run.glob("attempt-*")):
        records = [json.loads(line) for line in (adir / "timeline.jsonl").read_text().splitlines()]
        steps = [r for r in records if r["kind"] == "step"]
        first = min(r["step"] for r in steps)
        for r in steps:
            if r["step"] >= first + WARMUP_STEPS:
                steady.setdefault(r["rank"], []).append(r["step_s"])
    return steady


def test_per_rank_figures_are_right_and_the_straggler_stands_out(straggler_run: Path, built: tuple[Path, dict[str, Any]]) -> None:
    head = built[1]
    expected = _expected_steady(straggler_run)
    for rank, values in expected.items():
        got = head["step_time_s"][str(rank)]
        assert got["p50"] == pytest.approx(np.percentile(values, 50), abs=1e-4)
        assert got["p90"] == pytest.approx(np.percentile(values, 90), abs=1e-4)
        assert got["max"] == pytest.approx(max(values), abs=1e-4)
        assert got["steady_steps"] == len(values)
        assert got["warmup_steps"] == 2 * WARMUP_STEPS
    others = [head["step_time_s"][str(r)]["p50"] for r in (0, 1, 3)]
    assert head["step_time_s"]["2"]["p50"] > 1.4 * max(others)
    assert head["slowest_rank"]["vs_median"] == pytest.approx(STRAGGLER_FACTOR, rel=0.1)


def _timeline(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _step(rank: int, step: int, secs: float, at: float) -> dict[str, Any]:
    return {"t": at + 0.1, "kind": "step", "rank": rank, "node": "n1", "step": step, "phase": "collective", "at": at,
            "step_s": secs, "compute_s": secs / 2}


def _phase(rank: int, step: int, phase: str, at: float | None, t: float | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"t": t if t is not None else (at or 0) + 0.1, "kind": "phase", "rank": rank, "node": "n1",
                           "step": step, "phase": phase}
    if at is not None:
        rec["at"] = at
    return rec


def _minimal_run(root: Path, attempts: int = 1) -> Path:
    run = root / "run"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": "tiny", "gpus_per_node": 1, "world_size": 2}))
    (run / "state.json").write_text(json.dumps({"backend": "local", "job_id": "local-1", "state": "submitted"}))
    lines = []
    for n in range(1, attempts + 1):
        lines.append({"event": "start", "attempt": n, "job_id": "1", "time": 1000 + 100 * n, "nodes": 1})
        (run / f"attempt-{n}").mkdir()
        (run / f"attempt-{n}" / "attempt.json").write_text(json.dumps({"job_id": "1", "attempt": n, "hosts": ["n1"], "started": 1000 + 100 * n}))
    (run / "attempts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return run


def test_warmup_is_kept_apart_and_outliers_are_kept(tmp_path: Path) -> None:
    run = _minimal_run(tmp_path)
    secs = [5.0, 4.0, 3.0, 2.0, 1.5, 1.0, 1.0, 1.0, 1.0, 9.0]  # 5 warm-up steps, then one outlier
    _timeline(run / "attempt-1" / "timeline.jsonl", [_step(0, 10 + i, s, 2000.0 + i) for i, s in enumerate(secs)])
    report = collect(RunDir(run))
    st = report.figures.steps
    assert st is not None
    assert sorted(st.warmup[0].tolist()) == sorted(secs[:WARMUP_STEPS])  # in the plot's data
    assert sorted(st.steady[0].tolist()) == sorted(secs[WARMUP_STEPS:])
    figs = report.headline["step_time_s"]["0"]
    assert figs["p50"] == 1.0 and figs["max"] == 9.0  # the outlier is neither clipped nor dropped
    assert figs["steady_steps"] == 5 and figs["warmup_steps"] == 5


def test_the_slowest_rank_is_the_one_that_computes_longest_stalls_included(tmp_path: Path) -> None:
    """Under DDP every rank's step time is the same; rank 1 stalls 0.1 s on one step in four, which leaves its median
    compute time flat (the field's case: 'slowest rank: 1.007x' by step time while the heatmap showed rank 3)."""
    run = _minimal_run(tmp_path)
    records = []
    for i in range(40):
        for rank in (0, 1):
            record = _step(rank, i, 0.2, 2000.0 + i)
            record["compute_s"] = 0.02 + (0.1 if rank == 1 and i % 4 == 0 else 0.0) - (0.001 if rank == 1 else 0.0)
            records.append(record)
    _timeline(run / "attempt-1" / "timeline.jsonl", records)
    slow = collect(RunDir(run)).headline["slowest_rank"]
    assert (slow["rank"], slow["by"]) == (1, "mean compute time")
    assert slow["seconds"] == pytest.approx(0.019 + 0.1 * 8 / 35, abs=1e-4)  # 8 stalls in its 35 steady steps
    assert slow["vs_median"] > 1.3  # the median rank of two: between them


def test_phase_totals_per_rank(tmp_path: Path) -> None:
    run = _minimal_run(tmp_path)
    records = [
        _phase(0, 0, "forward", 10.0), _phase(1, 0, "forward", 10.0),
        _phase(0, 0, "backward", 11.0), _phase(1, 0, "backward", 12.0),
        _phase(0, 0, "optimizer", 13.0), _phase(1, 0, "optimizer", 14.0),
        _phase(0, 0, "collective", 13.5), _phase(1, 0, "collective", 14.5),
        _step(0, 0, 4.0, 14.0), _step(1, 0, 5.0, 15.0),  # step records are not phase changes
        _phase(0, 0, "idle", 14.0), _phase(1, 0, "idle", 15.0),
        _phase(0, 0, "save", 15.0), _phase(1, 0, "save", None, t=15.5),  # rank 1 without `at`: `t` stands in
        _phase(0, 0, "eval", 18.0), _phase(1, 0, "eval", 19.0),
        _phase(0, 1, "forward", 20.0), _phase(1, 1, "forward", 20.0),
        {"t": 23.0, "kind": "gone", "rank": 0, "node": "n1", "pid": 1, "at": 22.0},  # rank 0's last phase ends here
        {"t": 30.0, "kind": "gpu", "node": "n1", "gpus": {"0": {"temp": 50}}},
    ]
    _timeline(run / "attempt-1" / "timeline.jsonl", records)
    phases = collect(RunDir(run)).headline["phases_s"]
    want = {
        "0": {"compute": 3.5 + 2.0, "collective": 0.5, "idle": 1.0, "save": 3.0, "eval": 2.0},
        "1": {"compute": 4.5, "collective": 0.5, "idle": 0.5, "save": 3.5, "eval": 1.0},  # rank 1's last phase: no end known
    }
    for rank, cats in want.items():
        for cat in CATEGORIES:
            assert phases[rank][cat] == pytest.approx(cats.get(cat, 0.0)), (rank, cat)


def test_a_timeline_in_compressed_segments_reads_the_same_whole_and_in_stretches(tmp_path: Path) -> None:
    """A long attempt's timeline, closed and compressed segment by segment as the watch server writes it, gives
    the report the same arrays as the one file did: read whole, and in stretches past its share."""
    run = write_synthetic_run(tmp_path, steps=300, ranks=4, attempts=1)
    path = run / "attempt-1" / "timeline.jsonl"
    size = path.stat().st_size
    before = [read_timeline(path), read_timeline(path, size // 3)]
    assert before[1].read_share < 0.5
    assert len(timelinefile.split(path, size // 9)) >= 8
    after = [read_timeline(path), read_timeline(path, size // 3)]
    for old, new in zip(before, after):
        for name in ("phase_rank", "phase_cat", "phase_at", "step_rank", "step_step", "step_s", "phase_part"):
            assert np.array_equal(getattr(old, name), getattr(new, name)), name
        assert (old.gone, old.verdicts, old.size, old.read_share) == (new.gone, new.verdicts, new.size, new.read_share)


def test_timeline_in_another_layout_reads_the_same(tmp_path: Path) -> None:
    src = write_synthetic_run(tmp_path, steps=40, ranks=2, attempts=1)
    canonical = src / "attempt-1" / "timeline.jsonl"
    other = tmp_path / "sorted.jsonl"
    lines = canonical.read_text().splitlines()
    other.write_text("".join(json.dumps(json.loads(x), sort_keys=True, separators=(",", ":")) + "\n" for x in lines) + '{"torn')
    a, b = read_timeline(canonical), read_timeline(other)
    assert a.slow_chunks == 0 and b.slow_chunks > 0
    for field in ("phase_rank", "phase_cat", "phase_at", "step_rank", "step_step", "step_s"):
        assert np.allclose(getattr(a, field), getattr(b, field), rtol=1e-15, atol=0), field  # at most 1 ulp apart
    assert a.gone == b.gone and len(a.gone) == 2


def test_metrics_without_wall_clock_use_the_attempt_start(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": 3.0 - i, "step_s": 2.0, "compute_s": 1.0, "tokens_per_s": 10.0})
                            + "\n" for i in range(3)) + '{"step": 3, "lo')
    m = read_metrics(path, start=100.0)
    assert m.t.tolist() == [102.0, 104.0, 106.0] and m.t_derived
    assert np.isnan(m.val_loss).all()


def test_a_run_that_failed_in_preflight_still_gets_a_report(tmp_path: Path) -> None:
    run = _minimal_run(tmp_path)
    with open(run / "attempts.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "end", "attempt": 1, "job_id": "1", "exit": 81, "time": 1130}) + "\n")
    verdict = {"ok": False, "code": 81, "message": "preflight failed on gpu-007: GPU 3 missing",
               "culprits": [{"rank": 3, "host": "gpu-007", "reason": "GPU 3 missing"}]}
    (run / "attempt-1" / "verdict.json").write_text(json.dumps(verdict))
    (run / "attempt-1" / "timeline.jsonl").write_text("")
    out = tmp_path / "out"
    result = cli("report", str(run), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "gpu-007" in result.output
    assert "what it meant" in result.stdout and "job_id" not in result.stdout  # labels, not raw keys
    assert result.stdout.count("gpu-007: GPU 3 missing") <= 1  # the culprit's sentence once
    page = (out / "index.html").read_text()
    assert "gpu-007" in page and "GPU 3 missing" in page
    for name in FILES:
        png_size(out / name)
        assert f'src="{name}"' in page


@pytest.mark.parametrize("recorded, verdict", [
    (84, {"ok": True, "code": 0, "message": "all 2 ranks registered and checked"}),  # older runs: srun's 137 made 84
    (80, {"ok": False, "code": 80, "message": "the job was stopped from outside (scancel, clusterctl cancel or the time"
                                              " limit) before the rendezvous completed: 1 of 2 ranks had arrived"}),
    (89, {"ok": False, "code": 89, "message": "cancelled by clusterctl cancel: the job was stopped from outside; no node is blamed"}),
], ids=["old-ok-verdict", "old-80-verdict", "now"])
def test_a_cancelled_attempt_reads_cancelled_in_both_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str], recorded: int,
                                                            verdict: dict[str, Any]) -> None:
    from clusterctl.cli.report_cmd import print_text
    from clusterctl.views.report import page

    run = _minimal_run(tmp_path)
    with open(run / "attempts.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "end", "attempt": 1, "job_id": "1", "exit": recorded, "time": 1130}) + "\n")
        fh.write(json.dumps({"event": "next", "attempt": 1, "job_id": "1", "how": "stop", "exit": recorded, "time": 1130,
                             "reason": "stopped: by clusterctl cancel", "cancelled_by": "clusterctl cancel"}) + "\n")
    (run / "attempt-1" / "verdict.json").write_text(json.dumps({**verdict, "culprits": []}))
    report = collect(RunDir(run))
    (row,) = report.attempts
    (said,) = report.headline["verdicts"]
    assert (row["exit_code"], row["meaning"]) == (89, "cancelled by clusterctl cancel")
    assert (said["status"], said["code"], said["culprits"]) == ("cancelled", 89, [])
    assert said["message"].startswith("cancelled by clusterctl cancel")
    html = page.render(report.headline, report.state, report.attempts, None, "")
    verdicts = html.split("<h2>Verdicts</h2>")[1].split("<h2>")[0]
    assert "<td class=ok>cancelled</td><td>89</td>" in verdicts and ">failed<" not in verdicts and ">ok<" not in verdicts  # ok, failed or cancelled
    assert not report.figures.verdicts  # nothing marked in red: nobody is blamed
    print_text(report.headline)
    text = capsys.readouterr().out
    assert "attempt 1 verdict: cancelled (code 89) cancelled by clusterctl cancel" in text
    assert "verdict: ok" not in text and " 84 " not in text and " 80 " not in text


def test_json_prints_the_headline(straggler_run: Path, tmp_path: Path) -> None:
    result = cli("report", str(straggler_run), "-o", str(tmp_path / "r"), "--json")
    assert result.exit_code == 0, result.output
    head = json.loads(result.stdout)
    assert head["slowest_rank"]["rank"] == 2
    assert set(head["step_time_s"]) == {"0", "1", "2", "3"}
    assert head["verdicts"][0]["culprits"][0]["host"] == "node2"
    assert head["index"].endswith("index.html")


def test_bad_run_is_a_clear_error(tmp_path: Path) -> None:
    result = cli("report", str(tmp_path / "no-such-run"), "-o", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "no run" in result.output and "Traceback" not in result.output
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    result = cli("report", str(not_a_run))
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_without_matplotlib_the_figures_are_printed_and_exit_69(straggler_run: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "r"
    result = cli("report", str(straggler_run), "-o", str(out))
    assert result.exit_code == 69
    assert "pip install matplotlib" in result.output and "pip install -e '.[report]'" in result.output
    assert "slowest rank by mean compute time: 2" in result.output
    assert not out.exists()


def test_the_run_record_is_shown_when_there_is_one(tmp_path: Path) -> None:
    """What the trainer recorded for the attempt (record.json) reaches the page through the run record."""
    run = _minimal_run(tmp_path)
    (run / "attempt-1" / "record.json").write_text(json.dumps({"training": {"seeds": {"python": 1234}, "optimizer": "adamw"}}))
    out = tmp_path / "out"
    build_report(RunDir(run), out)
    page = (out / "index.html").read_text()
    assert "Run record" in page and "1234" in page and "adamw" in page


def test_the_trainers_own_metrics_lines_keep_their_validation_loss(tmp_path: Path) -> None:
    """The fast reader on lines the trainer wrote (a recorded run): every validation point survives."""
    import tarfile

    import numpy as np

    from clusterctl.views.report.load import read_metrics

    with tarfile.open(Path(__file__).resolve().parent / "fixtures" / "run-killed-rank.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    for path in sorted(tmp_path.glob("*/attempt-*/metrics.jsonl")):
        lines = path.read_text().splitlines()
        m = read_metrics(path, None)
        assert len(m.step) == len(lines) and not m.t_derived
        assert int((~np.isnan(m.val_loss)).sum()) == sum('"val_loss"' in line for line in lines) > 0


# --- what the plots show --------------------------------------------------------------------------------------


def test_the_heatmap_shows_compute_relative_to_the_steps_median_and_the_verdict_blames_its_rank(straggler_run: Path) -> None:
    from clusterctl.views.report.stats import figures

    fig = figures(collect(RunDir(straggler_run)).data)
    rows = np.nanmedian(fig.heatmap.matrix, axis=1)  # a rank's typical compute over its step's median
    assert rows[2] == pytest.approx(STRAGGLER_FACTOR, rel=0.1)  # the straggler: a bright row on the 1x..2x scale
    assert all(rows[r] == pytest.approx(1.0, abs=0.1) for r in (0, 1, 3))  # the healthy ranks: uniform
    (_, x0, first, last), (_, start2, _, _) = fig.heatmap.spans  # attempts side by side: a restart hides nothing
    per_x = fig.heatmap.matrix.shape[1] / fig.heatmap.width
    gap = fig.heatmap.matrix[:, int((x0 + last - first + 2) * per_x): int(start2 * per_x)]
    assert gap.size and np.isnan(gap).all()  # after the failed attempt: a grey gap where no rank reported
    (mark,) = fig.verdicts  # attempt 1's straggler verdict, where the plots mark it
    assert (mark.attempt, mark.code, mark.ranks, mark.label) == (1, 83, (2,), "83: rank 2")
    assert mark.step is not None and mark.t is not None


def test_throughput_drops_to_zero_across_a_stall_and_never_ramps() -> None:
    from clusterctl.views.report.plots import rolling, with_drops

    t = np.array([1.0, 2.0, 3.0, 4.0, 64.0, 65.0, 66.0])  # no step ended for 60 s after t=4
    tps = np.full(t.size, 100.0)
    med, lo, hi = rolling(tps, 3)
    assert med.tolist() == [100.0] * 7 and lo.tolist() == hi.tolist() == [100.0] * 7
    t2, (med2,) = with_drops(t, np.ones(t.size), [med])
    assert t2.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 63.0, 64.0, 65.0, 66.0]  # two zeros inside the gap
    assert med2.tolist() == [100.0] * 4 + [0.0, 0.0] + [100.0] * 3
    same, _ = with_drops(t[:4], np.ones(4), [med[:4]])
    assert same.tolist() == t[:4].tolist()  # steady steps: nothing inserted


@pytest.mark.parametrize("ranks", [8, 512])
def test_step_time_reads_in_seconds_at_8_and_at_512_ranks(ranks: int, tmp_path: Path) -> None:
    from clusterctl.views.report.plots import _seconds, plot_step_time, require
    from clusterctl.views.report.stats import figures

    run = write_synthetic_run(tmp_path, steps=20, ranks=ranks, attempts=1)
    plt = require()
    plot_step_time(plt, figures(collect(RunDir(run)).data), tmp_path / "step_time.png")
    width, height = png_size(tmp_path / "step_time.png")
    assert width <= 1200 and height <= 600  # one screen, whatever the rank count

    assert [_seconds(plt)(v, None) for v in (0.6, 0.25, 1.5, 0)] == ["600 ms", "250 ms", "1.5 s", "0"]  # not 6x10^-1


def test_the_page_shows_figures_as_the_terminal_does() -> None:
    """18,357 tokens/s on the page as on the terminal, never 1.836e+04."""
    from clusterctl.views.report import page

    html = page.render({"run": "r", "tokens_per_s_median": 18357.4, "attempts": 1, "final_loss": 0.123456}, None, [], None, "")
    assert "18,357" in html and "e+04" not in html and "0.1235" in html


def test_close_verdict_labels_stack_and_a_spiky_loss_goes_on_a_log_axis() -> None:
    """Four attempts' report: verdicts seconds apart get rows of their own; a first spike 100x the later loss would
    flatten every later attempt on a linear axis."""
    import numpy as np

    from clusterctl.views.report.plots import label_rows, loss_scale

    assert label_rows([0.0, 1.0, 2.0, 50.0, 51.0], span=100.0) == [0, 1, 2, 0, 1]
    assert label_rows([0.0, 20.0, 40.0], span=100.0) == [0, 0, 0]
    assert loss_scale(np.array([300.0, 40.0, *np.linspace(3.0, 2.0, 200)])) == "log"
    assert loss_scale(np.linspace(3.0, 2.0, 200)) == "linear"
    assert loss_scale(np.array([5.0, -1.0, 0.5, 0.4, 0.3])) == "linear"  # a loss that goes negative: no log axis


def test_a_timeline_past_the_budget_is_read_in_stretches_with_every_death_and_verdict(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A large job's timeline grows ~1 GB an hour: past the report's budget its phases and steps come from
    stretches spread from the start to the end, the deaths and verdicts from all of it, and the page says so."""
    run = write_synthetic_run(tmp_path, steps=1200, ranks=8, attempts=2, straggler=5)
    path = run / "attempt-1" / "timeline.jsonl"
    size = path.stat().st_size
    with path.open("a") as fh:  # a death in the middle of a gap: found by the byte search, not a stretch
        fh.write(json.dumps({"t": 1.0, "kind": "gone", "rank": 7, "node": "node4", "pid": 9, "at": 1.0}) + "\n")
    marks = path.with_name("timeline-marks.jsonl")
    with marks.open("a") as fh:  # and in the marks file, where the writer puts it too
        fh.write(json.dumps({"offset": size, "t": 1.0, "kind": "gone", "rank": 7, "node": "node4", "pid": 9, "at": 1.0}) + "\n")
    whole, part = read_timeline(path), read_timeline(path, size // 4)
    assert whole.read_share == 1 and 0.2 < part.read_share < 0.3, part.read_share
    assert part.gone == whole.gone and part.verdicts == whole.verdicts and 7 in part.gone
    marks.rename(marks.with_suffix(".aside"))  # a run written before the marks file: the bytes between are searched
    searched = read_timeline(path, size // 4)
    assert searched.gone == whole.gone and 7 in searched.gone
    marks.with_suffix(".aside").rename(marks)
    steps = set(part.step_step.tolist())
    assert steps < set(whole.step_step.tolist())
    assert {int(whole.step_step.min()), int(whole.step_step.max())} <= steps, "the warm-up's and the end's steps are read"
    assert len(set(part.phase_part.tolist())) == 32
    monkeypatch.setattr("clusterctl.views.report.load.READ_BYTES", size // 4)
    sampled, full = collect(RunDir(run)), None
    monkeypatch.undo()
    full = collect(RunDir(run))
    note = [n for n in sampled.headline["notes"] if "evenly spaced stretches" in n]
    assert note and "attempt 1" in note[0], sampled.headline["notes"]
    assert sampled.headline["slowest_rank"]["rank"] == full.headline["slowest_rank"]["rank"] == 5
    for rank, cats in full.headline["phases_s"].items():  # a phase never lasts across the bytes not read
        got = sampled.headline["phases_s"][rank]
        assert sum(got.values()) < 0.45 * sum(cats.values()), (rank, got, cats)
