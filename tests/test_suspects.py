"""Suspect nodes: remembered in the runs root, left out of new submissions for a while, listed and cleared."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, assert_names, cli, expect_cli_config_error, expect_config_error, write_yaml
from test_submit import spec_file as submit_spec

from clusterctl.config.site import load_site
from clusterctl.rundir import suspects
from clusterctl.rundir.suspects import FILE, Suspect

HOUR = 3600.0


def blame(node: str, at: float, run: str = "r1", code: int = 82, reason: str = "hang") -> Suspect:
    return Suspect(node, reason, code, run, at)


def after_attempt(runs: Path, monkeypatch: pytest.MonkeyPatch, code: int, verdict: dict[str, Any] | None,
                  hosts: list[str]) -> Path:
    """The batch script's recovery step after attempt 1 of a run in `runs` on `hosts` (no restart: budget 0)."""
    from clusterctl.runtime.recovery import nextattempt

    run = runs / "r-after"
    (run / "attempt-1").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"restart": {"budget": 0}}))
    if verdict is not None:
        (run / "attempt-1" / "verdict.json").write_text(json.dumps(verdict))
    (run / "hosts").write_text("\n".join(hosts) + "\n")
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", ",".join(hosts))
    nextattempt.main(["after", "--run-dir", str(run), "--nodes", str(len(hosts)), "--attempt", "1", "--code", str(code),
                      "--srun-exit", str(code), "--hosts-file", str(run / "hosts")])
    return run


def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An sbatch on PATH that records its arguments (the file it returns) and answers job 7."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch.argv"
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\necho 7\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_a_blamed_node_is_remembered_with_what_pointed_at_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = {"ok": False, "code": 82, "message": "hang: rank 1 on n2: process stopped", "fault": "node",
               "culprits": [{"rank": 1, "host": "n2", "gpu": 0, "reason": "process stopped", "evidence": "stopped"}]}
    after_attempt(tmp_path, monkeypatch, 82, stopped, ["n1", "n2"])
    found = suspects.active(tmp_path, 24 * HOUR)
    assert list(found) == ["n2"] and found["n2"].evidence == "stopped"
    listed = json.loads(cli("suspects", "--runs-root", str(tmp_path), "--json").stdout)
    assert [(row["node"], row["evidence"]) for row in listed] == [("n2", "stopped")]


def test_a_node_an_earlier_drill_blamed_returns_in_the_next_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drilled run with no spare left goes on in a new job that avoids the drilled node, as the real fault's
    would; the node is healthy, so the job after the next drill takes it back (else a soak of drills runs out of
    nodes nothing is wrong with). Real faults' nodes stay out."""
    from clusterctl.runtime.recovery import nextattempt

    calls = fake_sbatch(tmp_path, monkeypatch)

    def hang(host: str) -> dict:
        return {"ok": False, "code": 82, "message": f"hang: rank 1 on {host}: process stopped", "fault": "node",
                "culprits": [{"rank": 1, "host": host, "gpu": 0, "reason": "process stopped", "evidence": "stopped"}]}

    for drilled, runs in ((True, tmp_path / "drilled"), (False, tmp_path / "real")):
        run = runs / "r-after"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"restart": {"budget": 3}}))
        for attempt, (job, hosts) in enumerate((("6", ["n1", "n2"]), ("7", ["n1", "n3"])), start=1):
            (run / f"attempt-{attempt}").mkdir()
            (run / f"attempt-{attempt}" / "verdict.json").write_text(json.dumps(hang(hosts[1])))
            if drilled:
                (run / f"attempt-{attempt}" / "drill.json").write_text(json.dumps({"fault": "hang", "target": 1}))
            (run / "hosts").write_text("\n".join(hosts) + "\n")
            monkeypatch.setenv("SLURM_JOB_ID", job)
            monkeypatch.setenv("SLURM_JOB_NODELIST", ",".join(hosts))
            nextattempt.main(["after", "--run-dir", str(run), "--nodes", "2", "--attempt", str(attempt), "--code", "82",
                              "--srun-exit", "137", "--hosts-file", str(run / "hosts")])
    drilled_first, drilled_second, real_first, real_second = calls.read_text().splitlines()
    assert "--exclude=n2" in drilled_first and "--dependency=afterany:6" in drilled_first
    assert "--exclude=n3" in drilled_second and "n2" not in drilled_second
    assert "--exclude=n2" in real_first and "--exclude=n[2-3]" in real_second
    assert sorted(suspects.nodes(tmp_path / "drilled")) == ["n2", "n3"] and suspects.nodes(tmp_path / "drilled")["n2"].latest.drill


def test_a_node_an_earlier_drill_blamed_is_the_allocations_spare_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes and a spare: the first drilled hang's node is replaced by the spare; the second's, with no spare
    left, by the first drill's node, in the same job (a soak of drills restarts warm instead of waiting for a new
    job). Real faults' nodes stay out: the second real one needs a new job."""
    from clusterctl.rundir import history
    from clusterctl.runtime.recovery import nextattempt

    calls = fake_sbatch(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1,n2,n3")
    nexts = {}
    for drilled in (True, False):
        run = tmp_path / ("drilled" if drilled else "real") / "r-after"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"restart": {"budget": 3}}))
        hosts = ["n1", "n2"]
        for attempt in (1, 2):
            (run / f"attempt-{attempt}").mkdir()
            verdict = {"ok": False, "code": 82, "message": f"hang: rank 1 on {hosts[1]}: process stopped", "fault": "node",
                       "culprits": [{"rank": 1, "host": hosts[1], "gpu": 0, "reason": "process stopped", "evidence": "stopped"}]}
            (run / f"attempt-{attempt}" / "verdict.json").write_text(json.dumps(verdict))
            if drilled:
                (run / f"attempt-{attempt}" / "drill.json").write_text(json.dumps({"fault": "hang", "target": 1}))
            (run / "hosts").write_text("\n".join(hosts) + "\n")
            nextattempt.main(["after", "--run-dir", str(run), "--nodes", "2", "--attempt", str(attempt), "--code", "82",
                              "--srun-exit", "137", "--hosts-file", str(run / "hosts")])
            step = [e for e in history.read_events(run / "attempts.jsonl") if e.get("event") == history.EVENT_NEXT][-1]
            hosts = list(step.get("hosts") or [])
        nexts[drilled] = [(e["how"], e.get("hosts"), e["exclude"]) for e in history.read_events(run / "attempts.jsonl")
                          if e.get("event") == history.EVENT_NEXT]
    assert nexts[True] == [(history.NEXT_ALLOCATION, ["n1", "n3"], ["n2"]), (history.NEXT_ALLOCATION, ["n1", "n2"], ["n3"])]
    assert [(how, exclude) for how, _, exclude in nexts[False]] == [(history.NEXT_ALLOCATION, ["n2"]),
                                                                    (history.NEXT_CONTINUATION, ["n2", "n3"])]
    assert len(calls.read_text().splitlines()) == 1  # the real faults' new job, only


def test_the_scripts_own_error_makes_no_suspect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    same = {"ok": False, "code": 88, "fault": "script", "message": "the script failed the same way on every rank (2)",
            "culprits": [{"rank": 0, "host": "n1", "reason": "script failed: ValueError", "evidence": "exception"},
                         {"rank": 1, "host": "n2", "reason": "script failed: ValueError", "evidence": "exception"}]}
    after_attempt(tmp_path, monkeypatch, 88, same, ["n1", "n2"])
    assert suspects.nodes(tmp_path) == {}


def test_a_suspect_that_runs_an_attempt_to_its_end_is_cleared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    suspects.record(tmp_path, [blame("n1", now - HOUR), blame("n3", now - HOUR),
                               Suspect("n2", "drill hang", 82, "r0", now - HOUR, drill=True)])
    after_attempt(tmp_path, monkeypatch, 0, None, ["n1", "n2"])
    records = suspects.nodes(tmp_path)
    assert records["n1"].cleared is not None and "r-after attempt 1" in records["n1"].cleared.by
    assert records["n3"].cleared is None  # it did not run there
    assert records["n2"].cleared is None  # a drill's blame says nothing either way
    assert list(suspects.active(tmp_path, 24 * HOUR)) == ["n3"]


# --- the file ------------------------------------------------------------------------
def test_a_suspects_file_planted_as_a_link_is_neither_followed_nor_read(tmp_path: Path) -> None:
    """In a runs root others can write to (sticky 1777), a `suspects.jsonl` link planted before the first blame
    was followed: root appended a verdict line to a root-only file. Now the link is refused, and not read."""
    target = tmp_path / "root-only"
    target.write_text("")
    planted = tmp_path / "planted.jsonl"
    planted.write_text(json.dumps({"node": "n9", "reason": "planted", "code": 82, "run": "x", "time": time.time()}) + "\n")
    root = tmp_path / "runs"
    root.mkdir()
    (root / FILE).symlink_to(target)
    said = suspects.record(root, [blame("n1", time.time())])
    assert target.read_text() == "" and said and "cannot record suspect nodes n1" in said[0], said
    (root / FILE).unlink()
    (root / FILE).symlink_to(planted)
    assert suspects.nodes(root) == {}  # another's list of nodes to avoid is not this user's


def test_a_suspects_file_another_user_owns_is_neither_written_nor_read(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    root = tmp_path / "runs"
    root.mkdir()
    foreign = root / FILE
    foreign.write_text(json.dumps({"node": "n9", "reason": "planted", "code": 82, "run": "x", "time": time.time()}) + "\n")
    foreign.chmod(0o666)
    os.chown(foreign, 54321, 54321)  # a stranger made it first, writable by all
    said = suspects.record(root, [blame("n1", time.time())])
    assert said and "owned by uid 54321" in said[0], said
    assert "n1" not in foreign.read_text() and suspects.nodes(root) == {}




def test_record_and_active_over_the_time_window(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    assert suspects.active(root, HOUR) == {}  # no runs root yet, no file
    t0 = 1_000_000.0
    assert suspects.record(root, [blame("n1", t0), blame("n2", t0 + 10, code=83, reason="straggler")]) == []
    lines = (root / FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"node": "n1", "reason": "hang", "code": 82, "run": "r1", "time": t0},
        {"node": "n2", "reason": "straggler", "code": 83, "run": "r1", "time": t0 + 10},
    ]
    assert set(suspects.active(root, HOUR, now=t0 + 60)) == {"n1", "n2"}
    assert set(suspects.active(root, HOUR, now=t0 + HOUR + 5)) == {"n2"}  # n1's hour is over
    assert suspects.active(root, HOUR, now=t0 + 2 * HOUR) == {}
    assert suspects.active(root, 0, now=t0 + 1) == {}  # a window of 0 turns it off
    # A later blame renews the node and is the entry returned.
    suspects.record(root, [blame("n1", t0 + HOUR, run="r2", code=86, reason="node lost")])
    assert suspects.active(root, HOUR, now=t0 + HOUR + 5)["n1"] == blame("n1", t0 + HOUR, run="r2", code=86, reason="node lost")


def test_a_clear_forgives_until_the_next_blame(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    now = time.time()
    suspects.record(root, [blame("n1", now - 60), blame("n2", now - 60)])
    suspects.clear(root, ["n1"], by="admin")
    assert set(suspects.active(root, HOUR)) == {"n2"}
    record = suspects.nodes(root)["n1"]
    assert record.cleared is not None and record.cleared.by == "admin" and record.blames == 1
    suspects.record(root, [blame("n1", now, run="r3")])  # blamed again after the clear
    assert suspects.active(root, HOUR)["n1"].run == "r3"
    assert suspects.nodes(root)["n1"].blames == 2


def test_a_running_run_may_use_a_node_again_once_it_is_cleared_after_the_run_began_to_avoid_it(tmp_path: Path) -> None:
    """A run that shrank without n1 (its decision at t0) may have it back once someone clears it; a clear from
    before the run avoided it forgives nothing, nor does a clear of a node never blamed (the spec's own)."""
    root = tmp_path / "runs"
    t0 = time.time() - 30
    suspects.record(root, [blame("n1", t0), blame("n2", t0 - 100)])
    suspects.clear(root, ["n2"], now=t0 - 50)  # before this run avoided it (its blame in another run)
    since = {"n1": t0, "n2": t0, "n9": t0}
    assert suspects.forgiven(root, since) == set()
    suspects.clear(root, ["n1", "n9"], by="admin")
    assert suspects.forgiven(root, since) == {"n1"}
    events = [{"event": "start", "attempt": 1, "job_id": "5", "time": t0 - 10},
              {"event": "next", "attempt": 1, "job_id": "5", "how": "allocation", "exclude": ["n1"], "time": t0},
              {"event": "grow", "attempt": 1, "job_id": "5", "next_job": "6", "exclude": ["n8", "n1"], "time": t0}]
    run = tmp_path / "runs" / "r1"
    run.mkdir()
    (run / "attempts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    from clusterctl.rundir import RunDir, history

    told = history.read(RunDir(run))
    assert (told.excluded_since, told.grow_job, told.grow_exclude) == ({"n1": t0}, "6", ["n8", "n1"])
    assert told.avoided(["n8"]) == ["n8", "n1"] and told.avoided(["n8"], suspects.forgiven(root, told.excluded_since)) == ["n8"]


def test_torn_and_foreign_lines_are_skipped(tmp_path: Path) -> None:
    root = tmp_path
    now = time.time()
    good = json.dumps({"node": "n1", "reason": "hang", "code": 82, "run": "r", "time": now})
    junk = [
        "not json",
        "[1, 2]",
        json.dumps({"node": "n2", "time": "yesterday", "reason": "x", "code": 1, "run": "r"}),
        json.dumps({"node": "n3", "reason": "x", "code": True, "run": "r", "time": now}),
        json.dumps({"node": "", "reason": "x", "code": 1, "run": "r", "time": now}),
        json.dumps({"host": "n4", "time": now}),
        '{"node": "n5", "reason": "hang", "co',  # torn tail
    ]
    (root / FILE).write_text("\n".join([junk[0], good, *junk[1:]]), encoding="utf-8")
    assert set(suspects.active(root, HOUR)) == {"n1"}
    (root / FILE).write_bytes(b"\xff\xfe" + good.encode() + b"\n")  # undecodable bytes
    assert suspects.active(root, HOUR) == {}  # that line is garbled, and nothing raised


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from clusterctl.rundir import suspects
    root, who, start = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    time.sleep(max(0.0, start - time.time()))  # all begin together
    for i in range(150):
        found = [suspects.Suspect(f"{who}-{i}-{j}", who * 300, 82, f"run-{who}", time.time()) for j in range(2)]
        assert suspects.record(root, found) == []
    """
)


def test_concurrent_writers_never_tear_a_line(tmp_path: Path) -> None:
    start = str(time.time() + 1.0)
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), name, start], cwd=REPO)
        for name in ("a", "b", "c", "d")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    lines = (tmp_path / FILE).read_text().splitlines()
    assert len(lines) == 4 * 150 * 2
    entries = [json.loads(line) for line in lines]  # every line whole
    for who in "abcd":
        mine = [e for e in entries if e["run"] == f"run-{who}"]
        assert len(mine) == 300 and all(e["reason"] == who * 300 for e in mine)
    assert len(suspects.active(tmp_path, HOUR)) == 1200


# --- the drain hook ------------------------------------------------------------------


def test_drain_hook_gets_substituted_arguments_without_a_shell(tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    hook = [
        sys.executable,
        "-c",
        "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + chr(10))",
        str(out),
        "nodename={node}",
        "reason=clusterctl: {reason} ({run})",
        "{node}{node}",
        "$HOME; echo {unknown}",
    ]
    found = [blame("gpu-007", time.time(), run="llama-1", reason="hang: rank 3 stuck in {run}")]
    messages = suspects.record(tmp_path, found, hook)
    assert len(messages) == 1 and "gpu-007" in messages[0] and "ran" in messages[0]
    assert json.loads(out.read_text()) == [
        "nodename=gpu-007",
        "reason=clusterctl: hang: rank 3 stuck in {run} (llama-1)",  # a placeholder inside a value stays as written
        "gpu-007gpu-007",
        "$HOME; echo {unknown}",
    ]
    # Once per suspect.
    suspects.record(tmp_path, [blame("a1", time.time()), blame("a2", time.time())], hook)
    assert [json.loads(line)[0] for line in out.read_text().splitlines()] == ["nodename=gpu-007", "nodename=a1", "nodename=a2"]


def test_a_failing_hook_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = [blame("n1", time.time())]
    missing = suspects.record(tmp_path, found, [str(tmp_path / "no-such-hook"), "{node}"])
    assert len(missing) == 1 and "could not run" in missing[0] and "n1" in missing[0]
    failing = suspects.record(tmp_path, found, [sys.executable, "-c", "import sys; sys.exit('drain refused: no rights')"])
    assert len(failing) == 1 and "exit code 1" in failing[0] and "drain refused: no rights" in failing[0]
    monkeypatch.setattr(suspects, "DRAIN_TIMEOUT_S", 0.3)
    slow = suspects.record(tmp_path, found, [sys.executable, "-c", "import time; time.sleep(30)"])
    assert len(slow) == 1 and "did not finish" in slow[0]
    assert len((tmp_path / FILE).read_text().splitlines()) == 3  # the suspect was recorded each time


def test_an_unwritable_runs_root_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    messages = suspects.record(blocker / "runs", [blame("n1", time.time())])
    assert len(messages) == 1 and "cannot record suspect nodes n1" in messages[0]


# --- submit ----------------------------------------------------------------------------


def spec_file(tmp_path: Path, **extra: Any) -> Path:
    return submit_spec(tmp_path, **{"name": "sus", **extra})


def dry_run(tmp_path: Path, *args: str) -> tuple[str, Path]:
    result = cli("submit", str(tmp_path / "job.yaml"), "--dry-run", *args, cwd=tmp_path)
    assert result.exit_code == 0, result.output
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    return result.stdout, run


def test_submit_excludes_a_recorded_suspect_and_says_so(tmp_path: Path) -> None:
    spec_file(tmp_path, topology={"exclude": ["node4"]})
    root = tmp_path / "runs"
    now = time.time()
    suspects.record(root, [blame("node2", now - 600, run="old-run", reason="hang: rank 5 stopped")])
    suspects.record(root, [blame("gpu-9", now)])  # not a node of partition local: irrelevant here
    suspects.record(root, [blame("node3", now - 25 * HOUR)])  # blamed too long ago (24 h by default)
    out, run = dry_run(tmp_path)
    # 10 minutes ago when it was recorded, and the seconds the CLI took since (a loaded machine: several)
    assert re.search(r"excluding suspect node node2: hang: rank 5 stopped \(code 82\) in run old-run, 10m\d\ds ago;"
                     r" avoided until", out), out
    assert "gpu-9" not in out and "node3" not in out
    sbatch = (run / "job.sbatch").read_text()
    assert "#SBATCH --exclude=node4,node2\n" in sbatch
    assert json.loads((run / "run.json").read_text())["name"] == "sus"
    state = json.loads((run / "state.json").read_text())
    assert [s["node"] for s in state["suspects_excluded"]] == ["node2"]
    assert state["suspects_excluded"][0]["run"] == "old-run"
    assert yaml.safe_load((run / "spec.yaml").read_text())["topology"]["exclude"] == ["node4"]  # the user's spec


def test_a_submission_with_suspects_plans_the_job_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suspects are read before planning: one plan, and a refusal still names the spec's line."""
    from clusterctl.plan import job as planned

    calls: list[int] = []
    real = planned.make_plan
    monkeypatch.setattr(planned, "make_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    spec_file(tmp_path)
    suspects.record(tmp_path / "runs", [blame("node2", time.time())])
    dry_run(tmp_path)
    assert len(calls) == 1
    spec_file(tmp_path, nodes=9)  # more nodes than partition local has
    refused = cli("submit", str(tmp_path / "job.yaml"), "--dry-run", cwd=tmp_path)
    assert refused.exit_code == 65 and "nodes (line 1): got 9" in refused.output, refused.output
    assert len(calls) == 2


def test_avoid_suspects_false_keeps_them(tmp_path: Path) -> None:
    spec_file(tmp_path, topology={"avoid_suspects": False})
    suspects.record(tmp_path / "runs", [blame("node2", time.time())])
    out, run = dry_run(tmp_path)
    assert "--exclude" not in (run / "job.sbatch").read_text()
    assert "excluding" not in out
    assert "not excluded: topology.avoid_suspects is false" in out
    assert json.loads((run / "state.json").read_text())["suspects_excluded"] == []


def test_too_few_nodes_left_excludes_none_and_warns(tmp_path: Path) -> None:
    spec_file(tmp_path, nodes=2, spares=1, topology={"exclude": ["node1"]})  # 3 of 4 needed, 1 already excluded
    suspects.record(tmp_path / "runs", [blame("node2", time.time()), blame("node3", time.time())])
    out, run = dry_run(tmp_path)
    assert "warning: suspect nodes node[2-3] are not excluded: partition local has 3 usable nodes" in out
    assert "the job needs 2 + 1 spares" in out and "would leave 1" in out
    assert "#SBATCH --exclude=node1\n" in (run / "job.sbatch").read_text()
    state = json.loads((run / "state.json").read_text())
    assert state["suspects_excluded"] == [] and [s["node"] for s in state["suspects_kept"]] == ["node2", "node3"]


def test_a_cleared_suspect_is_not_excluded(tmp_path: Path) -> None:
    spec_file(tmp_path)
    root = tmp_path / "runs"
    suspects.record(root, [blame("node2", time.time())])
    result = cli("suspects", "--runs-root", str(root), "--clear", "node2", "--clear", "node9")
    assert result.exit_code == 0, result.output
    assert "cleared node2" in result.stdout and "node9 is not a suspect" in result.stdout
    out, run = dry_run(tmp_path)
    assert "suspect node" not in out and "--exclude" not in (run / "job.sbatch").read_text()


def test_suspect_hours_zero_turns_it_off(tmp_path: Path) -> None:
    site = yaml.safe_load((REPO / "site-configs" / "local.yaml").read_text())
    site["reliability"] = {"suspect_hours": 0}
    write_yaml(tmp_path, site, "site.yaml")
    spec_file(tmp_path, site=str(tmp_path / "site.yaml"))
    suspects.record(tmp_path / "runs", [blame("node2", time.time())])
    out, run = dry_run(tmp_path)
    assert "suspect node" not in out and "--exclude" not in (run / "job.sbatch").read_text()


# --- the site's fields ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("reliability", "path", "value", "allowed"),
    [
        ({"suspect_hours": -1}, "reliability.suspect_hours", -1, "at least 0"),
        ({"drain_command": ["/sbin/drain", "bad\x00arg"]}, "reliability.drain_command[1]", "bad\x00arg", "without NUL or control"),
        ({"drain_command": ["drain\n{node}"]}, "reliability.drain_command[0]", "drain\n{node}", "without NUL or control"),
    ],
)
def test_bad_site_values_exit_65_naming_the_field(
    tmp_path: Path, reliability: dict[str, Any], path: str, value: Any, allowed: str
) -> None:
    site = yaml.safe_load((REPO / "site-configs" / "local.yaml").read_text())
    site["reliability"] = reliability
    site_path = write_yaml(tmp_path, site, "site.yaml")
    err = expect_config_error(lambda: load_site(str(site_path)), tmp_path)
    assert_names(err, path, value, allowed)
    expect_cli_config_error(["site", "validate", site_path], tmp_path, path)
    spec_file(tmp_path, site=str(site_path))
    expect_cli_config_error(["submit", tmp_path / "job.yaml", "--dry-run"], tmp_path, path)


def test_site_fields_have_their_defaults() -> None:
    site, _ = load_site("local")
    assert site.reliability.suspect_hours == 24
    assert site.reliability.drain_command is None


# --- clusterctl suspects ---------------------------------------------------------------


def test_suspects_lists_active_ones_and_all_with_json(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    now = time.time()
    suspects.record(root, [blame("gpu-1", now - 60, run="llama-7", code=83, reason="straggler")])
    suspects.record(root, [blame("gpu-2", now - 48 * HOUR)])
    suspects.record(root, [blame("gpu-3", now - 10)])
    suspects.clear(root, ["gpu-3"], by="admin")
    table = cli("suspects", "--runs-root", str(root))
    assert table.exit_code == 0, table.output
    assert "gpu-1" in table.stdout and "straggler" in table.stdout and "llama-7" in table.stdout
    assert "gpu-2" not in table.stdout and "gpu-3" not in table.stdout
    listed = json.loads(cli("suspects", "--runs-root", str(root), "--json").stdout)
    assert [(r["node"], r["state"], r["code"], r["run"]) for r in listed] == [("gpu-1", "active", 83, "llama-7")]
    assert listed[0]["until"] == pytest.approx(listed[0]["time"] + 24 * HOUR)
    assert set(listed[0]) == {"node", "state", "reason", "evidence", "code", "run", "time", "until", "blames", "cleared_by",
                               "drill"}
    everything = json.loads(cli("suspects", "--runs-root", str(root), "--json", "--all").stdout)
    assert [(r["node"], r["state"], r["cleared_by"]) for r in everything] == [
        ("gpu-1", "active", None),
        ("gpu-2", "expired", None),
        ("gpu-3", "cleared", "admin"),
    ]
    (tmp_path / "empty").mkdir()
    empty = cli("suspects", "--runs-root", str(tmp_path / "empty"))
    assert empty.exit_code == 0 and "no active suspect nodes" in empty.stdout
    nowhere = cli("suspects", "--runs-root", str(tmp_path / "nowhere"))  # a typo is not "no suspects"
    assert nowhere.exit_code == 2 and f"no runs root {tmp_path / 'nowhere'}" in nowhere.output


def test_a_drills_culprit_is_listed_as_such_and_not_avoided_unless_asked(tmp_path: Path) -> None:
    spec_file(tmp_path)
    root = tmp_path / "runs"
    suspects.record(root, [Suspect("node2", "rank 1 killed", 84, "drilled-run", time.time(), drill=True)])
    assert '"drill": true' in (root / FILE).read_text() and '"drill"' not in json.dumps(suspects._blame_line(blame("x", 0)))
    out, run = dry_run(tmp_path)
    assert "suspect node" not in out and "--exclude" not in (run / "job.sbatch").read_text()  # a fault on purpose
    listed = json.loads(cli("suspects", "--runs-root", str(root), "--json").stdout)
    assert [(r["node"], r["state"], r["drill"]) for r in listed] == [("node2", "drill", True)]
    assert "drill" in cli("suspects", "--runs-root", str(root)).stdout
    spec_file(tmp_path, topology={"avoid_drill_suspects": True})
    shutil.rmtree(run)
    out, run = dry_run(tmp_path)
    assert "#SBATCH --exclude=node2\n" in (run / "job.sbatch").read_text()


def test_suspects_follows_a_specs_runs_root_and_site(tmp_path: Path) -> None:
    site = yaml.safe_load((REPO / "site-configs" / "local.yaml").read_text())
    site["reliability"] = {"suspect_hours": 1}
    write_yaml(tmp_path, site, "site.yaml")
    spec_file(tmp_path, site=str(tmp_path / "site.yaml"))
    suspects.record(tmp_path / "runs", [blame("node1", time.time() - 2 * HOUR), blame("node2", time.time() - 60)])
    listed = json.loads(cli("suspects", "--spec", str(tmp_path / "job.yaml"), "--json", cwd=tmp_path).stdout)
    assert [r["node"] for r in listed] == ["node2"]  # the site's one hour, in the spec's runs root
