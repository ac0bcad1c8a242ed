"""What the controller does about a finding while the ranks run, and whom it blames once they are gone.

A finding of the watchdog (hang, straggler, lost node) is recorded by the
attempt's verdict keeper; on a hang the survivors are asked for their
stacks first (the verdict's evidence); then every rank is stopped through
the node aggregators. When the attempt ends, the facts the watchdog kept
(when each process ended, which aggregators vanished), srun's task lines and
the ranks' own errors go to the blame (runtime/controller/blame.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from clusterctl import rundir
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.controller.blame import OOM, blame_end, node_failures, parse_srun_lines
from clusterctl.runtime.controller.keeper import VerdictKeeper
from clusterctl.runtime.controller.watchdog import Watchdog
from clusterctl.runtime.controller.watchserver import WatchServer

DUMP_WAIT_S = 3.0  # how long the survivors get to write their stacks before they are stopped
SETTLE_S = 2.0  # how long the end-of-attempt blame waits for the aggregators' last words


class Response:
    def __init__(self, attempt_dir: Path, server: WatchServer, watchdog: Watchdog, keeper: VerdictKeeper) -> None:
        self.attempt_dir = attempt_dir
        self.server = server
        self.watchdog = watchdog
        self.keeper = keeper

    def on_finding(self, finding: Verdict) -> None:
        """Record the finding; on a hang, collect the survivors' stacks first; then stop every rank."""
        self.keeper.give(finding)
        if finding.code == ExitCode.HANG:
            hosts = {str(v.get("host") or "") for v in finding.culprits + finding.victims}  # a large world's few
            self.server.send_all("dump", hosts if all(hosts) else None)  # the named ranks' nodes write their stacks
            waiting = [v["rank"] for v in finding.victims]
            deadline = time.monotonic() + DUMP_WAIT_S
            while time.monotonic() < deadline and not all(self._stack_written(r) for r in waiting):
                time.sleep(0.1)
            evidence: dict[str, Any] = {"stacks": {
                str(r): str(rundir.stack_file(self.attempt_dir, r).relative_to(self.attempt_dir))
                for r in waiting if self._stack_written(r)
            }}
            traces = sorted(p.name for p in self.attempt_dir.glob(f"{rundir.NCCL_TRACE_PREFIX}*"))
            if traces:
                evidence["nccl_flight_recorder"] = traces
            self.keeper.add_evidence(evidence)
        self.server.send_all("kill")

    def _stack_written(self, rank: int) -> bool:
        try:
            return rundir.stack_file(self.attempt_dir, rank).stat().st_size > 0
        except OSError:
            return False

    def end_verdict(self, errors: dict[int, str], gpus: dict[int, Any], returned: dict[int, int] | None = None) -> Verdict | None:
        """Culprits apart from victims, once every rank is done; None when no rank failed.

        `returned`: rank -> its command's code, for the ranks that said their command returned (a rank that
        did is done, whatever srun says of its process afterwards)."""
        try:
            lines = (self.attempt_dir / rundir.SRUN_LOG).read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        ends = parse_srun_lines(lines)
        if not errors and not self.watchdog.lost_nodes and not any(e.signalled or e.exit_code for e in ends):
            return None  # every rank ended well (or on request): nothing to judge
        self.server.wait_until(self.watchdog.accounted, SETTLE_S)
        with self.server.lock:
            facts = self.watchdog.facts(gpus, errors, ends, node_failures(lines))
            facts.steps = {r.rank: r.steps_done for r in self.watchdog.ranks}
        facts.returned = dict(returned or {})
        facts.oom = any(OOM.search(line) for line in lines)
        return blame_end(facts)
