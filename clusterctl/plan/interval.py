"""The checkpoint interval by Young/Daly: tau = sqrt(2 * delta * M).

delta is the cost of one save, M the job's mean time between failures. The
expected fraction of time lost is about delta/tau (saving) + tau/(2M) (work
redone after a failure, half an interval on average).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class IntervalAdvice:
    save_s: float
    mtbf_s: float
    interval_s: float
    lost_fraction: float
    save_estimated: bool  # True when save_s came from size / bandwidth, not a measurement

    def as_dict(self) -> dict[str, float | bool]:
        return {
            "save_s": round(self.save_s, 3),
            "mtbf_s": round(self.mtbf_s, 1),
            "interval_s": round(self.interval_s, 1),
            "lost_fraction": round(self.lost_fraction, 5),
            "save_estimated": self.save_estimated,
        }


def young_daly(save_s: float, mtbf_s: float) -> tuple[float, float]:
    """(interval, expected fraction of time lost) for a save cost and an MTBF, both in seconds."""
    interval = math.sqrt(2 * save_s * mtbf_s)
    return interval, save_s / interval + interval / (2 * mtbf_s)


def advise(
    state_bytes_per_gpu: float,
    gpus_per_node: int,
    write_gbs_per_node: float,
    node_mtbf_hours: float,
    nodes: int,
    save_seconds: float | None = None,
    job_mtbf_s: float | None = None,
) -> IntervalAdvice:
    """Advice from the plan: a measured save cost when given, else the node's bytes over its bandwidth."""
    estimated = save_seconds is None
    save_s = save_seconds if save_seconds is not None else state_bytes_per_gpu * gpus_per_node / (write_gbs_per_node * 1e9)
    save_s = max(save_s, 1e-3)
    mtbf_s = job_mtbf_s if job_mtbf_s is not None else node_mtbf_hours * 3600 / max(1, nodes)
    interval, lost = young_daly(save_s, mtbf_s)
    return IntervalAdvice(save_s, mtbf_s, interval, lost, estimated)
