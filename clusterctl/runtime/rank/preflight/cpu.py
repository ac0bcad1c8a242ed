"""The `cpu` check: the rank runs on exactly the CPUs the plan binds it to.

A lost binding is silent (threads on another socket's memory, only slower),
so it is compared here with the rank's real affinity.
"""

from __future__ import annotations

import os

from clusterctl.runtime.rank.preflight.common import _skip
from clusterctl.runtime.rank.preflight.context import CheckResult, PreflightContext
from clusterctl.syntax.cpulist import format_cpulist


def check_cpu(ctx: PreflightContext) -> CheckResult:
    """The rank runs on exactly the CPUs the plan binds it to.

    A binding lost to a container runtime, a cgroup or a launcher that ignores
    numactl puts data-loader threads on another socket's memory: slow, silent.
    """
    if not ctx.expected_cpus:
        return _skip("cpu", "the plan gives no CPU set for this rank")
    seen = frozenset(os.sched_getaffinity(0))
    expected = frozenset(ctx.expected_cpus)
    data = {"expected": format_cpulist(expected), "seen": format_cpulist(seen)}
    if seen == expected:
        return CheckResult("cpu", True, False, f"rank {ctx.rank} on {ctx.host} bound to CPUs {data['seen']}", data)
    missing, extra = expected - seen, seen - expected
    data["missing"] = format_cpulist(missing)
    data["extra"] = format_cpulist(extra)
    parts = []
    if missing:
        parts.append(f"missing {data['missing']}")
    if extra:
        parts.append(f"extra {data['extra']}")
    detail = (
        f"rank {ctx.rank} on {ctx.host} runs on CPUs {data['seen']} but the plan binds it to "
        f"{data['expected']} ({', '.join(parts)})"
    )
    return CheckResult("cpu", False, False, detail, data)
