"""Crash consistency: writers killed at every phase of a save never leave a bad newest generation.

Each trial forks two ranks from this process (torch already imported), lets
them resume and save, and kills both with SIGKILL either when one enters a
chosen phase or after a random delay. After every trial `latest_committed`
must be the newest generation whose commit rename happened, verify cleanly,
load, and hold exactly the tensors and per-rank extras of its step.
`bench/checkpoint_crash.py` runs the same drill with 1,000 trials.
"""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl.checkpoint import durable, latest_committed, list_generations, names, phases, protocol
from clusterctl.testing import crashdrill as drill

TRIALS = 40  # killed trials; runs whose kill point is not reached come on top


def test_kills_in_every_phase_leave_the_newest_committed_generation_loadable(tmp_path: Path) -> None:
    report = drill.run(tmp_path, TRIALS, seed=20261130)
    summary = report.summary()
    print(f"\n  crash drill: {summary}")
    assert report.failures == []
    assert summary["trials"] == report.kills == TRIALS
    assert summary["phases_missed"] == [], f"phases never hit by a kill: {summary['phases_missed']}"
    assert report.latest_steps == sorted(report.latest_steps), "the newest committed step never goes back"
    # After the last (killed) trial one clean save clears every leftover.
    clean = drill.run(tmp_path, 0)
    assert clean.failures == []
    kinds = [(i.kind, i.step) for i in list_generations(tmp_path)]
    assert [k for k, _ in kinds] == [names.COMMITTED, names.COMMITTED], kinds


def _commit_manifest_after_rename(directory, tmp, step, token, manifest):  # the bug the protocol avoids
    final = directory / names.committed(step)
    phases.enter(phases.RENAME, step)
    os.rename(tmp, final)
    phases.enter(phases.COMMITTED, step)
    protocol.manifest_mod.write(final, manifest)
    durable.fsync_dir(directory)
    return final


def test_the_drill_catches_a_protocol_that_commits_before_its_manifest(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(protocol, "commit", _commit_manifest_after_rename)
    report = drill.run(tmp_path, 12, seed=7, timed_fraction=0.0)
    assert any("torn committed generation" in f or "latest_committed is step" in f for f in report.failures), (
        report.failures
    )


def test_latest_is_never_a_temporary_even_when_only_temporaries_exist(tmp_path: Path) -> None:
    (tmp_path / names.temporary(3, "abcd0001-1")).mkdir()
    assert latest_committed(tmp_path) is None
