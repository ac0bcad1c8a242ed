"""The step watcher on a script that imports nothing of clusterctl: steps from torch's hooks, compute apart from waiting.

Two real gloo ranks (tests/programs/stepwatch_ranks.py); rank 1 works 0.15 s
longer before each step, so rank 0 waits for it in DDP's gradient
all-reduce. What a user relies on: both ranks report every step, the rank
that waits does not look slow (its compute time leaves the wait out), the
slow one does, and rank 0's metrics.jsonl holds the loss it recorded.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.runtime.rank import stepwatch

PROGRAM = Path(__file__).parent / "programs" / "stepwatch_ranks.py"


def run_ranks(tmp_path: Path, *flags: str) -> dict[int, list[dict]]:
    """Both ranks' step heartbeats, by rank."""
    sock_path = str(tmp_path / "hb.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.2)
    port = str(21000 + os.getpid() % 8000)
    env = {**os.environ, "CLUSTERCTL_HEARTBEAT_SOCKET": sock_path, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(PROGRAM), str(r), "2", port, str(tmp_path), *flags], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    steps: dict[int, list[dict]] = {0: [], 1: []}
    try:
        while any(p.poll() is None for p in procs):
            try:
                msg = json.loads(sock.recv(65536))
            except TimeoutError:
                continue
            if msg["kind"] == "step":
                steps[msg["rank"]].append(msg)
    finally:
        sock.close()
    for p in procs:
        out = p.communicate(timeout=60)[0]
        assert p.returncode == 0, out
    return steps


@pytest.mark.parametrize("flags", [(), ("--own-hook", "--sgd")], ids=["default", "own-hook-sgd"])
def test_a_plain_ddp_loop_reports_every_step_and_the_waiting_rank_does_not_look_slow(tmp_path: Path, flags: tuple) -> None:
    steps = run_ranks(tmp_path, *flags)
    for rank in (0, 1):
        assert [m["step"] for m in steps[rank]] == list(range(8)), steps[rank]
    later = {r: steps[r][2:] for r in (0, 1)}  # the first steps carry start-up
    waiting = statistics.median(m["compute_s"] / m["step_s"] for m in later[0])
    slow = statistics.median(m["compute_s"] / m["step_s"] for m in later[1])
    assert statistics.median(m["step_s"] for m in later[0]) >= 0.14  # rank 0's steps last as long as rank 1's ...
    assert waiting < 0.5 and slow > 0.8, (waiting, slow)  # ... but it spends them waiting, rank 1 computing
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(8))
    assert all(isinstance(line["loss"], float) and line["tokens_per_s"] > 0 for line in lines), lines
    assert all(line["schedule"] == {"lr": 0.01} for line in lines)  # a dict stays one


def test_the_step_number_is_the_optimizers_own_count_after_a_resume() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.ones(2))
    adam = torch.optim.AdamW([param])
    assert stepwatch.optimizer_step(adam) is None  # no step taken yet
    param.grad = torch.ones(2)
    adam.step()
    state = adam.state_dict()
    state["state"][0]["step"] = torch.tensor(41.0)  # a checkpoint saved after 41 steps
    adam.load_state_dict(state)
    adam.step()
    assert stepwatch.optimizer_step(adam) == 41  # the 42nd step: 0-based 41
    assert stepwatch.optimizer_step(torch.optim.SGD([param], lr=0.1)) is None  # keeps no count: the attempt counts


def test_a_forward_without_gradients_is_an_evaluation_not_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference trainer's evaluation at step 24 took longer than 5 steps: taken for `forward`, it was judged
    by a step's timeout, a false hang on every rank. A forward under no_grad, or of a model in eval mode, is `eval`
    (judged by watchdog.hang_timeout); a training forward is `forward`."""
    torch = pytest.importorskip("torch")
    noted: list[str] = []

    class Watch:
        def note(self, phase: str) -> None:
            noted.append(phase)

    monkeypatch.setattr(stepwatch, "_WATCH", Watch())
    model = torch.nn.Linear(2, 2)
    stepwatch._on_forward(model, ())
    with torch.no_grad():
        stepwatch._on_forward(model, ())
    model.eval()
    stepwatch._on_forward(model, ())
    model.train()
    stepwatch._on_forward(model, ())
    assert noted == ["forward", "eval", "eval", "forward"]
