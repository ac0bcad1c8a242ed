"""Admission: may the ranks that registered start training? The rendezvous's verdict.

Pure: registrations in (their summaries, runtime/wire/registration.py), verdict
out, so every check is tested without processes. Preflight failures come
first (they name nodes to exclude); then ranks that never arrived or failed
before registering, duplicate ranks, stale processes of another attempt,
wrong world sizes or nodes, and torch/CUDA/NCCL versions that differ.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.verdict import FAULT_NODE, Verdict
from clusterctl.runtime.wire.greeting import registered_here
from clusterctl.runtime.wire.registration import VERSION_KEYS
from clusterctl.syntax.cpulist import format_cpulist


def _ranges(ranks: list[int]) -> str:
    """`0-3,7` for messages (the CPU-list notation)."""
    return format_cpulist(ranks)


Finding = tuple[list[str], list[dict[str, Any]]]  # (problems, one line each; culprits)


def judge(
    records: dict[int, dict[str, Any]],
    duplicates: dict[int, list[dict[str, Any]]],
    *,
    world_size: int,
    hosts: list[str],
    gpus_per_node: int,
    token: str,
    errors: dict[int, str] | None = None,
    log_errors: dict[int, str] | None = None,
    nvlink_groups: Iterable[tuple[str, list[int]]] = (),
) -> Verdict:
    """Decide whether the rendezvous may complete.

    `records` maps rank -> its registration (first claimant), `duplicates`
    rank -> records of later claimants, `errors` rank -> an error the rank
    reported before it could register, `log_errors` rank -> the first line
    it wrote to its node log (for ranks that could not even reach the store).
    A missing rank with an error is a culprit; missing ranks without one
    either never arrived (a hang: culprits) or were stopped with the culprit.
    Preflight failures come first (they name nodes to exclude), then an NVLink
    group split across racks, then every other problem in one verdict.
    """

    def host_of(rank: int) -> str:
        slot = rank // gpus_per_node
        return hosts[slot] if slot < len(hosts) else "?"

    verdict = _preflight(records, token, host_of) or nvlink_split(records, nvlink_groups, host_of)
    if verdict is not None:
        return verdict
    problems: list[str] = []
    culprits: list[dict[str, Any]] = []
    for found, named in (_missing(records, world_size, errors or {}, log_errors or {}, host_of),
                         _duplicated(records, duplicates), _misplaced(records, world_size, token, host_of),
                         _mismatched_versions(records)):
        problems += found
        culprits += named
    if problems:
        return Verdict(False, int(ExitCode.RENDEZVOUS_FAILED), "rendezvous failed: " + " | ".join(problems), culprits)
    return Verdict(True, 0, f"all {world_size} ranks registered and checked")


def _preflight(records: dict[int, dict[str, Any]], token: str, host_of: Callable[[int], str]) -> Verdict | None:
    """81 naming every node whose ranks failed a check (a stale process's checks say nothing of this attempt)."""
    failed: dict[str, list[str]] = defaultdict(list)
    culprits: list[dict[str, Any]] = []
    for rank, rec in sorted(records.items()):
        if not registered_here(token, rec):
            continue
        for check in rec.get("preflight", []):
            if not check.get("ok", True):
                failed[rec.get("host", host_of(rank))].append(f"rank {rank} {check['name']}: {check['detail']}")
                culprits.append({"rank": rank, "host": rec.get("host"), "reason": f"preflight {check['name']}",
                                 "evidence": "preflight"})
    if not failed:
        return None
    lines = [f"{host}: {'; '.join(items)}" for host, items in sorted(failed.items())]
    return Verdict(False, int(ExitCode.PREFLIGHT_FAILED), f"preflight failed on {len(failed)} node(s): " + " | ".join(lines),
                   culprits, {"nodes": sorted(failed)}, fault=FAULT_NODE)


def _missing(records: dict[int, dict[str, Any]], world_size: int, errors: dict[int, str], log_errors: dict[int, str],
             host_of: Callable[[int], str]) -> Finding:
    """Ranks that never registered: those that said why are the culprits; the silent ones are, unless another
    failed first (then they were stopped with it)."""
    problems: list[str] = []
    culprits: list[dict[str, Any]] = []
    missing = [r for r in range(world_size) if r not in records]
    failed_early = {r: errors.get(r) or log_errors.get(r) for r in missing if errors.get(r) or log_errors.get(r)}
    for r, err in sorted(failed_early.items()):
        problems.append(f"rank {r} on {host_of(r)} failed before registering: {err}")
        culprits.append({"rank": r, "host": host_of(r), "reason": "failed before registering"})
    silent = [r for r in missing if r not in failed_early]
    if silent:
        by_host: dict[str, list[int]] = defaultdict(list)
        for r in silent:
            by_host[host_of(r)].append(r)
        where = "; ".join(
            f"{'rank' if len(ranks) == 1 else 'ranks'} {_ranges(ranks)} on {host}" for host, ranks in sorted(by_host.items())
        )
        if failed_early:
            problems.append(f"{len(silent)} other rank(s) did not register before the job step ended: {where}")
        else:
            problems.append(f"{len(silent)} of {world_size} ranks never arrived: {where}")
            culprits += [{"rank": r, "host": host_of(r), "reason": "never arrived"} for r in silent]
    return problems, culprits


def _duplicated(records: dict[int, dict[str, Any]], duplicates: dict[int, list[dict[str, Any]]]) -> Finding:
    """A rank claimed more than once: the later claimants are the culprits."""
    problems: list[str] = []
    culprits: list[dict[str, Any]] = []
    for rank, extra in sorted(duplicates.items()):
        first = records.get(rank, {})
        who = [f"pid {r.get('pid')} on {r.get('host')}" for r in [first, *extra]]
        problems.append(f"rank {rank} registered {len(who)} times: {', '.join(who)}")
        culprits += [{"rank": rank, "host": r.get("host"), "reason": "duplicate rank"} for r in extra]
    return problems, culprits


def _misplaced(records: dict[int, dict[str, Any]], world_size: int, token: str, host_of: Callable[[int], str]) -> Finding:
    """A stale process, a rank started with another world size, or on another node than the plan's."""
    problems: list[str] = []
    culprits: list[dict[str, Any]] = []
    for rank, rec in sorted(records.items()):
        host = rec.get("host")
        if not registered_here(token, rec):  # its seal or proof failed: nothing in it can be believed, its host least
            problems.append(
                f"rank {rank} (pid {rec.get('pid')} on {host}) carries another attempt's token: a stale process"
                " (or a record written without this attempt's secret)"
            )
            culprits.append({"rank": rank, "host": host_of(rank), "reason": "stale attempt"})
            continue
        if rec.get("world_size") != world_size:
            problems.append(f"rank {rank} on {host} was started with WORLD_SIZE={rec.get('world_size')}, the plan has {world_size}")
            culprits.append({"rank": rank, "host": host, "reason": "wrong world size"})
        expected = host_of(rank)
        if host != expected:
            problems.append(f"rank {rank} runs on {host}, the plan puts it on {expected}")
            culprits.append({"rank": rank, "host": host, "reason": "wrong node"})
    return problems, culprits


def _mismatched_versions(records: dict[int, dict[str, Any]]) -> Finding:
    """Ranks whose torch, CUDA, NCCL or HIP differ from most ranks': those few are the culprits."""
    problems: list[str] = []
    culprits: list[dict[str, Any]] = []
    for key in VERSION_KEYS:
        seen: dict[Any, list[int]] = defaultdict(list)
        for rank, rec in records.items():
            seen[rec.get("versions", {}).get(key)].append(rank)
        if len(seen) > 1:
            common = max(seen, key=lambda v: len(seen[v]))
            odd = [
                f"{value} on ranks {_ranges(ranks)} ({', '.join(sorted({records[r].get('host', '?') for r in ranks}))})"
                for value, ranks in seen.items()
                if value != common
            ]
            problems.append(f"{key} versions differ: {common} on most ranks, " + "; ".join(odd))
            culprits += [
                {"rank": r, "host": records[r].get("host"), "reason": f"{key} version"}
                for value, ranks in seen.items()
                if value != common
                for r in ranks
            ]
    return problems, culprits


def nvlink_split(records: dict[int, dict[str, Any]], groups: Iterable[tuple[str, list[int]]],
                 host_of: Callable[[int], str]) -> Verdict | None:
    """An NVLink-bound group whose GPUs report two NVLink fabrics (cluster UUID and clique, from NVML): Slurm put
    the group's nodes in two racks, and its collectives would leave NVLink. Refused before training (81), naming
    the ranks and nodes of each side; the nodes are healthy, so none is blamed for exclusion."""
    for kind, group in groups:
        sides: dict[str, list[int]] = defaultdict(list)
        for rank in group:
            fabric = records.get(rank, {}).get("fabric")
            if fabric:
                sides[fabric].append(rank)
        if len(sides) < 2:
            continue
        said = "; ".join(
            f"{'rank' if len(ranks) == 1 else 'ranks'} {_ranges(ranks)} on {', '.join(dict.fromkeys(records[r].get('host') or host_of(r) for r in ranks))}"
            f" (fabric {fabric})" for fabric, ranks in sides.items())
        culprits = [{"rank": r, "host": records[r].get("host") or host_of(r), "reason": "NVLink domain", "exclude": False}
                    for ranks in sides.values() for r in ranks]
        return Verdict(False, int(ExitCode.PREFLIGHT_FAILED),
                       f"NVLink placement failed: a {kind} group spans {len(sides)} NVLink domains: {said}",
                       culprits, {"kind": kind, "fabrics": {f: ranks for f, ranks in sides.items()}})
    return None
