"""One line for a training script's metrics: `from clusterctl.watch import record; record(loss=loss, tokens=n)`.

Call it once per step, anywhere before the optimizer's `step()` (or before
`Contract.after_step`, which takes the same values itself). Rank 0's values
go to the attempt's metrics.jsonl with that step's step and compute time:
`loss` (shown by `clusterctl status`, plotted by `clusterctl report`),
`tokens` (this rank's tokens in the step: tokens/s is derived) and any
other number or string. A one-element tensor is read when the next step
ends, when the device has long finished it: no synchronisation each step.
Outside a clusterctl job, or with `watchdog.steps: off`, it does nothing.
"""

from __future__ import annotations

from typing import Any

from clusterctl.runtime.rank import stepwatch


def record(**values: Any) -> None:
    """Record this step's values (rank 0's are written; the others' are dropped)."""
    watch = stepwatch.current()
    if watch is not None:
        watch.record({k: v for k, v in values.items() if v is not None})
