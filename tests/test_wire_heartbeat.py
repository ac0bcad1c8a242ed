"""The heartbeat path's one definition (runtime/wire/heartbeat.py): what the rank sends passes the aggregator's
validator as it is, anything else is dropped, and the controller's commands read back as sent."""

from __future__ import annotations

import json

import pytest

from clusterctl.runtime.rank.heartbeat import Heartbeat
from clusterctl.runtime.wire import heartbeat as wire


@pytest.mark.parametrize("kind", wire.RANK_KINDS)
def test_every_message_a_rank_sends_is_one_the_aggregator_passes_on(kind: str) -> None:
    beat = Heartbeat(3, attempt=2, socket_path="")  # no socket: nothing is sent, the message is still built
    beat.step_done(17, 0.25, 0.2)
    sent = beat.message(kind)
    assert wire.parse_rank_message(json.dumps(sent).encode()) == sent
    assert set(sent) == {"kind", "rank", "attempt", "step", "phase", "step_s", "compute_s", "t", "pid", "gpu"}


@pytest.mark.parametrize("changed", [
    {"kind": "progress"}, {"kind": None}, {"rank": "3"}, {"rank": -1}, {"rank": True}, {"pid": -5}, {"pid": "1"},
    {"step": 1.5}, {"step": "7"}, {"phase": "training"}, {"step_s": "fast"}, {"t": [1]},
])
def test_a_message_the_rank_would_never_send_is_dropped(changed: dict) -> None:
    good = Heartbeat(0, socket_path="").message(wire.STEP)
    assert wire.parse_rank_message(json.dumps({**good, **changed}).encode()) is None


def test_what_is_not_a_message_at_all_is_dropped() -> None:
    for data in (b"", b"\xff\xfe", b"[]", b"null", b"{" * 5000, b'"step"'):
        assert wire.parse_rank_message(data) is None


def test_the_controllers_commands_read_back_as_sent_and_nothing_else_is_one() -> None:
    for cmd in (wire.DUMP, wire.KILL):
        assert wire.command(wire.command_line(cmd).strip()) == cmd
    for line in (b'{"cmd": "reboot"}', b"[1]", b"kill", b"{" * 5000):
        assert wire.command(line) is None
    with pytest.raises(ValueError, match="unknown aggregator command"):
        wire.command_line("reboot")
