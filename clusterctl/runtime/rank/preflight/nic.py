"""The `nic` check: every NIC the plan gives a rank exists in sysfs, its port or link up.

It reads only sysfs (class/infiniband for RDMA devices, class/net for
netdevs), under SYSFS, which tests point at a fake tree.
"""

from __future__ import annotations

import os
from typing import Any

from clusterctl.runtime.rank.preflight.common import _one_line, _read, _skip
from clusterctl.runtime.rank.preflight.context import CheckResult, PreflightContext

# The sysfs root, module-level so tests can point it at a fake tree.
SYSFS = "/sys"

_RDMA_KINDS = ("ib", "roce")


def check_nic(ctx: PreflightContext) -> CheckResult:
    """Every NIC the plan gives this rank exists, and its port or link is up.

    NCCL given a missing HCA falls back to another (or to TCP) without an
    error, so a dead rail otherwise shows up only as a slow job.
    """
    if not ctx.nics:
        return _skip("nic", "no NICs in the plan for this rank")
    kinds = tuple(ctx.nic_kinds) or ("unknown",) * len(ctx.nics)
    if len(kinds) != len(ctx.nics):
        return CheckResult(
            "nic",
            ok=False,
            skipped=False,
            detail=f"the plan gives {len(ctx.nics)} NICs but {len(ctx.nic_kinds)} kinds: {', '.join(ctx.nics)}",
            data={"nics": list(ctx.nics), "kinds": list(ctx.nic_kinds)},
        )
    seen: list[dict[str, Any]] = []
    problems: list[str] = []
    for nic, kind in zip(ctx.nics, kinds):
        fact, problem = _probe_nic(nic, kind)
        seen.append(fact)
        if problem:
            problems.append(f"NIC {nic} ({kind}) {problem}")
    data = {"nics": seen}
    if problems:
        return CheckResult("nic", False, False, _one_line(f"on {ctx.host}: " + "; ".join(problems)), data)
    states = ", ".join(f"{f['name']} {f['state']}" for f in seen)
    return CheckResult("nic", True, False, f"NICs on {ctx.host}: {states}", data)


def _probe_nic(nic: str, kind: str) -> tuple[dict[str, Any], str | None]:
    fact: dict[str, Any] = {"name": nic, "kind": kind}
    if not nic or "/" in nic or nic in (".", ".."):
        fact["state"] = None
        return fact, "is not a valid device name"
    ib_dir = os.path.join(SYSFS, "class", "infiniband", nic)
    net_dir = os.path.join(SYSFS, "class", "net", nic)
    # EFA devices are RDMA devices (rdmapXsY) but a plan may also name their
    # netdev, so both places are accepted for them, and for a NIC of unknown kind.
    either = kind in ("efa", "unknown")
    if kind in _RDMA_KINDS or (either and os.path.isdir(ib_dir)):
        fact["path"] = ib_dir
        if not os.path.isdir(ib_dir):
            fact["state"] = None
            return fact, f"missing: no {ib_dir}"
        state = _read(os.path.join(ib_dir, "ports", "1", "state"))
        rate = _read(os.path.join(ib_dir, "ports", "1", "rate"))
        if rate is not None:
            fact["rate"] = rate
        if state is None:
            fact["state"] = "present"
            return fact, None
        # sysfs writes "4: ACTIVE"
        word = state.split(":", 1)[-1].strip()
        fact["state"] = word
        if word != "ACTIVE":
            return fact, f"port 1 is {word}, not ACTIVE ({os.path.join(ib_dir, 'ports', '1', 'state')})"
        return fact, None
    fact["path"] = net_dir
    if not os.path.isdir(net_dir):
        fact["state"] = None
        where = f"no {ib_dir} or {net_dir}" if either else f"no {net_dir}"
        return fact, f"missing: {where}"
    operstate = _read(os.path.join(net_dir, "operstate"))
    fact["state"] = operstate if operstate is not None else "present"
    if operstate is None:
        return fact, None
    allowed = ("up", "unknown") if (kind == "loopback" or nic == "lo") else ("up",)
    if operstate not in allowed:
        return fact, f"link is {operstate}, not up ({os.path.join(net_dir, 'operstate')})"
    return fact, None
