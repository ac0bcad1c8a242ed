"""The attempt's one verdict keeper: every finding goes through it, and it alone writes verdict.json.

The controller hands it the rendezvous verdict (or the refusal of a file
limit too small for the job), the watchdog's finding while the ranks train
(hang, straggler, lost node), the comm/compute checks' outcome and the blame
once the ranks are gone. The first failure is the attempt's verdict: a later
one (a victim's reaction, the end's blame of what the watchdog already
called) never replaces it; only evidence gathered for it (a hang's stacks) is
added. Thread-safe: the watch thread and the controller's main thread both
give findings.

Once the job is stopped from outside (scancel, `clusterctl cancel`, the time
limit: SIGTERM to every process of the job), the ranks die because of the
stop, not because of a node: a finding given after that which blames ranks
is logged, never recorded, so no node is excluded or suspected for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.verdict import Verdict


class VerdictKeeper:
    def __init__(self, attempt_dir: Path, log: Callable[[str], None] = print) -> None:
        self.attempt_dir = attempt_dir
        self.log = log
        self._lock = threading.Lock()
        self._current: Verdict | None = None
        self._stopped_from_outside = False

    @property
    def current(self) -> Verdict | None:
        with self._lock:
            return self._current

    @property
    def failure(self) -> Verdict | None:
        """The attempt's failing verdict, once there is one."""
        with self._lock:
            return self._current if self._current is not None and not self._current.ok else None

    def stopped_from_outside(self) -> None:
        """The job is being stopped from outside: from now on no finding blames a rank."""
        with self._lock:
            self._stopped_from_outside = True

    def give(self, finding: Verdict) -> Verdict:
        """Record a finding; the attempt's verdict afterwards (the first failure stays)."""
        with self._lock:
            if self._current is not None and not self._current.ok:
                return self._current
            if self._stopped_from_outside and finding.culprits:
                self.log(f"not recorded, the job was being stopped from outside: {finding.message}")
                return finding
            self._current = finding
            verdictfile.write(self.attempt_dir, finding)
        self.log(finding.message)
        return finding

    def add_evidence(self, evidence: dict[str, Any]) -> None:
        """More evidence for the verdict given (a hang's stack dumps), written at once."""
        with self._lock:
            if self._current is None:
                return
            self._current.evidence.update(evidence)
            verdictfile.write(self.attempt_dir, self._current)
