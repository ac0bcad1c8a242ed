"""Compute time on a GPU comes from the stream's timeline, not the host's: under NCCL only the stream waits.

No GPU here or in CI: the stream is a stand-in whose clock the test drives
(events stamped where the host enqueued them, passed when the device got
there), so what is checked is the arithmetic and the reading a step late.
bench/gpu_check.sh runs the same code on a real GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from clusterctl.runtime.rank.devicespans import DeviceSpans
from clusterctl.runtime.rank.heartbeat import Heartbeat
from clusterctl.runtime.rank.stepwatch import StepWatch


class Stream:
    """A device stream: work enqueued runs back to back; `done` is how far the device has got."""

    def __init__(self) -> None:
        self.tail = 0.0  # when the last enqueued work ends
        self.done = 0.0

    def run(self, seconds: float) -> None:
        self.tail += seconds

    def event(self) -> "Event":
        return Event(self)


class Event:
    def __init__(self, stream: Stream) -> None:
        self.stream, self.at = stream, None

    def record(self) -> None:
        self.at = self.stream.tail

    def query(self) -> bool:
        return self.at is not None and self.at <= self.stream.done

    def elapsed_time(self, end: "Event") -> float:
        assert self.query() and end.query(), "read before the device passed it: a real GPU would fail here"
        return (end.at - self.at) * 1000.0


def step(spans: DeviceSpans, stream: Stream, compute: float, wait: float) -> float | None:
    """One step as a DDP rank enqueues it: compute, then the last bucket's all-reduce that waits `wait` for a peer."""
    spans.begin()
    stream.run(compute)
    spans.wait_begin()
    stream.run(wait)
    spans.wait_end()
    return spans.end()


def test_a_rank_that_waits_on_the_stream_is_not_slow_and_the_slow_one_is() -> None:
    fast, slow = Stream(), Stream()
    fast_spans, slow_spans = DeviceSpans(fast.event), DeviceSpans(slow.event)
    readings: dict[str, list] = {"fast": [], "slow": []}
    for _ in range(4):
        readings["fast"].append(step(fast_spans, fast, compute=0.2, wait=0.3))  # waits for the slow peer
        readings["slow"].append(step(slow_spans, slow, compute=0.5, wait=0.0))
        fast.done, slow.done = fast.tail, slow.tail  # the device catches up after the host's step ended
    # The host runs ahead: the first step is read only at the second step's end, and each reading is a step late.
    assert readings["fast"][0] is None and readings["slow"][0] is None
    assert [round(r, 6) for r in readings["fast"][1:]] == [0.2] * 3
    assert [round(r, 6) for r in readings["slow"][1:]] == [0.5] * 3


def test_a_device_far_behind_is_never_waited_for_and_the_oldest_steps_are_dropped() -> None:
    stream = Stream()
    spans = DeviceSpans(stream.event)
    assert [step(spans, stream, 0.1, 0.0) for _ in range(20)] == [None] * 20  # never read unfinished: no sync
    stream.done = stream.tail
    assert round(step(spans, stream, 0.1, 0.05) or 0, 6) == 0.1  # caught up: the newest finished step
    assert spans.end() is None  # an end without a begin reads nothing


def test_the_step_watch_reports_the_device_compute_once_the_device_has_it(tmp_path: Path) -> None:
    stream = Stream()
    watch = StepWatch(0, 2, Heartbeat(rank=0, socket_path=""), tmp_path / "metrics.jsonl")
    watch.device = DeviceSpans(stream.event)
    reports = []
    for _ in range(3):
        watch.start()
        stream.run(0.2)
        watch.on_grad_ready(7)  # the backward's last gradient: DDP hands its last bucket over ...
        stream.run(0.4)  # ... the stream waits for the peer's all-reduce (the host does not)
        watch.on_backward_end()
        reports.append(watch.step_done())
        stream.done = stream.tail
    first, *later = reports
    assert first["compute_s"] < 0.1  # the host's (which did no work here) until the device has one
    assert [round(r["compute_s"], 6) for r in later] == [0.2, 0.2]
    watch.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line.get("compute_on") for line in lines] == [None, "cuda", "cuda"]  # the metrics say which clock timed it
