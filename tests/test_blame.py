"""Whose fault a failed attempt is (runtime/controller/blame.py, runtime/controller/errorpatterns.py): pure, made-up facts.

The script's faults blame no node and stop the run (88); node evidence names the node whatever the others
raised; one rank's exception is ambiguous; the same file-system error everywhere is shared infrastructure.
"""

from __future__ import annotations

import pytest

from clusterctl.exitcodes import ExitCode
from clusterctl.runtime.controller import errorpatterns
from clusterctl.runtime.controller.blame import Facts, blame_end, parse_srun_lines

HOSTS = ["n1", "n2"]
TB = "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n{}"
KILL_ON_BAD_EXIT = """srun: error: n1: task 0: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=5.0
srun: error: n2: tasks 2-3: Terminated
srun: error: n1: task 1: Terminated""".splitlines()


def facts(errors: dict[int, str], lines: list[str] = KILL_ON_BAD_EXIT, **more) -> Facts:
    return Facts(world=4, hosts=HOSTS, gpus_per_node=2, errors=errors, srun=parse_srun_lines(lines), **more)


def test_the_same_exception_on_every_rank_is_the_scripts_and_names_every_rank() -> None:
    errors = {r: TB.format(f"ValueError: learning rate must be positive (rank {r})") for r in range(4)}
    verdict = blame_end(facts(errors, steps={r: 0 for r in range(4)}))
    assert verdict is not None and verdict.code == ExitCode.SCRIPT_ERROR and verdict.fault == "script"
    assert sorted(c["rank"] for c in verdict.culprits) == [0, 1, 2, 3]
    assert "every rank (4)" in verdict.message and "ValueError: learning rate must be positive" in verdict.message
    assert "not a node's" in verdict.message and verdict.victims == []


def test_the_same_exception_on_ranks_of_every_node_is_the_scripts_though_others_saw_only_the_peer() -> None:
    errors = {0: TB.format("TypeError: fit() got multiple values for keyword argument 'max_steps'"),
              2: TB.format("TypeError: fit() got multiple values for keyword argument 'max_steps'"),
              1: "RuntimeError: [gloo] Connection closed by peer", 3: "RuntimeError: Connection reset by peer"}
    verdict = blame_end(facts(errors, steps={0: 12, 1: 12, 2: 12, 3: 12}))
    assert verdict.code == ExitCode.SCRIPT_ERROR and verdict.fault == "script"
    assert sorted(c["rank"] for c in verdict.culprits) == [0, 2]
    assert sorted(v["rank"] for v in verdict.victims) == [1, 3]


def test_set_device_local_rank_on_every_node_is_the_scripts_and_the_verdict_says_the_fix() -> None:
    """torchrun's `torch.cuda.set_device(LOCAL_RANK)`: each rank sees one GPU, so LOCAL_RANK 1 fails on every node;
    LOCAL_RANK 0 waits for it. No node is blamed, and the verdict says what to write instead."""
    ordinal = TB.format("torch.AcceleratorError: CUDA error: invalid device ordinal")
    errors = {1: ordinal, 3: ordinal, 0: "RuntimeError: [gloo] Connection closed by peer"}
    verdict = blame_end(facts(errors, steps={r: 0 for r in range(4)}))
    assert verdict.code == ExitCode.SCRIPT_ERROR and verdict.fault == "script"
    assert sorted(c["rank"] for c in verdict.culprits) == [1, 3]
    assert "set_device(LOCAL_RANK % torch.cuda.device_count())" in verdict.message


def test_peer_failures_on_every_rank_never_count_as_the_same_exception() -> None:
    errors = {r: "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer" for r in range(4)}
    verdict = blame_end(facts(errors))
    assert verdict.code == ExitCode.SCRIPT_FAILED and verdict.fault == "ambiguous"


@pytest.mark.parametrize("error", [
    TB.format("ModuleNotFoundError: No module named 'trian'"),
    TB.format("  File \"train.py\", line 3\n    def f(:\n         ^\nSyntaxError: invalid syntax"),
    TB.format("FileNotFoundError: [Errno 2] No such file or directory: '/work/trian.py'"),
    "SystemExit(2)",
])
def test_a_python_error_before_the_first_step_is_the_scripts_even_on_one_rank(error: str) -> None:
    verdict = blame_end(facts({0: error}))
    assert verdict.code == ExitCode.SCRIPT_ERROR and verdict.fault == "script"
    assert [c["rank"] for c in verdict.culprits] == [0] and "before its first step" in verdict.message


def test_a_missing_file_after_training_began_is_ambiguous_on_one_rank() -> None:
    error = TB.format("FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-17.bin'")
    verdict = blame_end(facts({0: error}, steps={0: 30, 1: 30, 2: 30, 3: 30}))
    assert verdict.code == ExitCode.SCRIPT_FAILED and verdict.fault == "ambiguous"


def test_one_ranks_exception_is_ambiguous_and_its_signature_is_kept_for_the_next_attempt() -> None:
    verdict = blame_end(facts({0: TB.format("IndexError: index 4096 is out of bounds for shard 3")}, steps={0: 5}))
    assert verdict.code == ExitCode.SCRIPT_FAILED and verdict.fault == "ambiguous"
    assert verdict.evidence["signature"] == "IndexError: index N is out of bounds for shard N"


def test_a_hardware_error_names_the_node_whatever_the_others_raised() -> None:
    errors = {r: TB.format("ValueError: bad config") for r in range(4)}
    errors[3] = TB.format("RuntimeError: CUDA error: uncorrectable ECC error encountered")
    verdict = blame_end(facts(errors, steps={r: 3 for r in range(4)}))
    assert verdict.fault == "node" and [c["rank"] for c in verdict.culprits] == [3]
    assert verdict.culprits[0]["evidence"] == "hardware"


def test_a_rank_killed_from_outside_names_its_node_but_a_kill_on_every_node_does_not() -> None:
    one = """srun: error: n2: task 3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=5.0
srun: error: n1: tasks 0-1: Terminated""".splitlines()
    verdict = blame_end(facts({0: "RuntimeError: Connection closed by peer"}, one))
    assert verdict.fault == "node" and [c["rank"] for c in verdict.culprits] == [3]
    everywhere = ["srun: error: n1: task 0: Killed", "srun: error: n2: task 2: Killed"]
    assert blame_end(facts({}, everywhere)).fault == "ambiguous"


def test_an_oom_kill_is_not_the_nodes() -> None:
    one = ["slurmstepd: error: Detected 1 oom_kill event in StepId=5.0", "srun: error: n2: task 3: Killed"]
    verdict = blame_end(facts({}, one, oom=True))
    assert verdict.fault == "ambiguous"


def test_the_same_file_system_error_everywhere_is_shared_infrastructure() -> None:
    errors = {r: TB.format("OSError: [Errno 28] No space left on device: '/ckpt/step-40/shard-3'") for r in range(4)}
    verdict = blame_end(facts(errors, steps={r: 40 for r in range(4)}))
    assert verdict.code == ExitCode.SCRIPT_FAILED and verdict.fault == "infrastructure"


def test_sys_exit_3_on_every_rank_is_the_scripts() -> None:
    verdict = blame_end(facts({r: "SystemExit(3)" for r in range(4)}, steps={r: 2 for r in range(4)}))
    assert verdict.code == ExitCode.SCRIPT_ERROR


def test_ranks_whose_command_returned_are_done_whatever_srun_says_afterwards() -> None:
    lines = ["srun: error: n1: tasks 0,2: Killed", "srun: error: n2: task 3: Killed"]  # --wait=60 after the first exit
    assert blame_end(facts({}, lines, returned={0: 0, 1: 0, 2: 0, 3: 0})) is None
    some = blame_end(facts({1: TB.format("ValueError: only rank 1")}, lines, returned={0: 0, 2: 0, 3: 0}, steps={1: 9}))
    assert [c["rank"] for c in some.culprits] == [1]
    assert {v["rank"] for v in some.victims}.isdisjoint({0, 2, 3}) and some.evidence["returned"] == [0, 2, 3]


def test_a_message_with_more_culprits_names_them_all() -> None:
    errors = {0: TB.format("ValueError: a"), 3: TB.format("KeyError: 'b'")}
    verdict = blame_end(facts(errors, steps={0: 4, 3: 4}))
    assert verdict.fault == "ambiguous" and len(verdict.culprits) == 2
    named = {c["rank"] for c in verdict.culprits}
    assert all(f"rank {r}" in verdict.message for r in named)


def test_signatures_set_rank_numbers_and_addresses_aside() -> None:
    a = errorpatterns.signature(TB.format("ValueError: shard 3 of 8 at 0x7f3a2b has 17 rows"))
    b = errorpatterns.signature(TB.format("ValueError: shard 5 of 8 at 0x7f3c11 has 17 rows"))
    assert a == b == "ValueError: shard N of N at N has N rows"
    assert errorpatterns.exception_type(TB.format("torch.OutOfMemoryError: CUDA out of memory")) == "OutOfMemoryError"


@pytest.mark.parametrize("text, kind", [
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "hardware"),
    ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", "hardware"),
    ("RuntimeError: CUDA error: unspecified launch failure", "hardware"),
    ("NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0, len 0, vendor err 129", "hardware"),
    ("OSError: [Errno 116] Stale file handle", "infrastructure"),
    ("OSError: [Errno 30] Read-only file system: '/ckpt'", "infrastructure"),
    ("torch.distributed.DistNetworkError: Connection reset by peer", "peer"),
    ("RuntimeError: [Rank 1] Watchdog caught collective operation timeout", "peer"),
    ("ValueError: bad learning rate", "script"),
])
def test_error_patterns_sort_each_kind(text: str, kind: str) -> None:
    found = ("hardware" if errorpatterns.is_hardware(text) else "infrastructure" if errorpatterns.is_infrastructure(text)
             else "peer" if errorpatterns.is_peer_failure(text) else "script")
    assert found == kind
