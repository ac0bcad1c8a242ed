"""Registration: the keys ranks and the controller share in the store, and the verdict.

Every rank claims its rank number, writes one registration record and bumps
a counter; the controller waits for the counter, reads the records and
judges them. `judge` is pure: records in, verdict out, so every check is
tested without processes.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from clusterctl.cpulist import format_cpulist
from clusterctl.exitcodes import ExitCode

PREFIX = "clusterctl/"
ARRIVED = PREFIX + "arrived"
VERDICT = PREFIX + "verdict"
DUPLICATES = PREFIX + "duplicates"  # appended "rank:claim," by every claimant after the first
ERRORED = PREFIX + "errored"  # appended "rank," by every rank that wrote error_key(rank)
POSTCHECK = PREFIX + "postcheck"  # rank 0's outcome of the comm/compute checks
STOP = PREFIX + "stop"  # set by the controller when the batch shell asks the ranks to save and stop


def parse_list(raw: bytes) -> list[str]:
    return [item for item in raw.decode().split(",") if item]


def claim_key(rank: int) -> str:
    return f"{PREFIX}claim/{rank}"


def reg_key(rank: int, claim: int = 1) -> str:
    """The first claimant's record; later claimants (duplicates) write under their claim number."""
    return f"{PREFIX}reg/{rank}" if claim == 1 else f"{PREFIX}reg/{rank}/dup{claim}"


def error_key(rank: int) -> str:
    return f"{PREFIX}error/{rank}"


VERSION_KEYS = ("torch", "cuda", "nccl", "hip")
JUDGED = ("rank", "world_size", "host", "pid", "token", "gpu", "versions")  # what judge() and the end's blame read
VERDICT_GRACE_S = 30.0  # ranks wait this long past the rendezvous timeout for the controller's verdict ...
VERDICT_GRACE_PER_RANK_S = 200e-6  # ... plus this per rank: ~10x the controller's measured work per rank (bench/controller_scale.py)


def verdict_margin_s(world_size: int) -> float:
    """How long past its deadline a rank waits for the verdict: the controller's work grows with the world."""
    return VERDICT_GRACE_S + VERDICT_GRACE_PER_RANK_S * max(0, world_size)


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The part of a registration the controller judges: a few fields and the failed preflight checks."""
    head = {k: record[k] for k in JUDGED if k in record}
    checks = record.get("preflight")
    if isinstance(checks, list):
        head["preflight"] = [c for c in checks if isinstance(c, dict) and not c.get("ok", True)]
    return head


def encode_registration(record: dict[str, Any]) -> bytes:
    """What a rank stores: its summary line, then its full record, both compact JSON.

    The controller decodes only the short first line (a ~1.7 KB record costs
    ~30 us to decode, its summary a fraction of that: seconds at 100,000
    ranks) and copies the second into manifest.json without decoding it.
    json.dumps never writes a raw newline, so the split is unambiguous.
    """
    full = json.dumps(record, separators=(",", ":"))
    return (json.dumps(summary(record), separators=(",", ":")) + "\n" + full).encode()


def _summary_cut(raw: bytes) -> int | None:
    """Where a stored registration's summary line ends, when it has the two-line form."""
    cut = raw.find(b"\n")
    if cut > 0 and raw[cut + 1 : cut + 2] == b"{" and raw.endswith(b"}") and raw.find(b"\n", cut + 1) < 0:
        return cut
    return None


def decode_registration(raw: bytes) -> tuple[dict[str, Any], bytes | memoryview]:
    """(summary, full record as compact JSON) from a stored registration.

    The full record is a view into `raw`, not a copy. A value without the
    summary line (one written as plain JSON) is decoded whole; one that is
    not a JSON object is kept as a record that says so, so a garbled
    registration is judged (no token: a stale process) rather than crashing
    the controller.
    """
    cut = _summary_cut(raw)
    if cut is not None:
        try:
            found = json.loads(raw[:cut])
        except ValueError:
            found = None
        if isinstance(found, dict):
            return found, memoryview(raw)[cut + 1 :]
    try:
        record = json.loads(raw)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        record = {"undecodable": f"{exc}: {raw[:200]!r}"}
    return summary(record), json.dumps(record, separators=(",", ":")).encode()


def full_record(raw: bytes) -> bytes | memoryview:
    """The full record of a stored registration as compact JSON, without decoding its summary again."""
    cut = _summary_cut(raw)
    return memoryview(raw)[cut + 1 :] if cut is not None else decode_registration(raw)[1]


def share_values(head: dict[str, Any], seen: dict[Any, Any]) -> dict[str, Any]:
    """One object for values that most ranks repeat (host, token, versions): less memory at 100,000 ranks.

    The shared objects are only read (judge, blame), never changed.
    """
    for key in ("host", "token"):
        value = head.get(key)
        if isinstance(value, str):
            head[key] = seen.setdefault(value, value)
    versions = head.get("versions")
    if isinstance(versions, dict):
        try:
            head["versions"] = seen.setdefault(("versions", *versions.items()), versions)
        except TypeError:  # an unhashable value: keep this rank's own
            pass
    return head


@dataclass
class Verdict:
    ok: bool
    code: int
    message: str
    culprits: list[dict[str, Any]] = field(default_factory=list)  # {"rank", "host", "gpu", "reason"}, primary first
    evidence: dict[str, Any] = field(default_factory=dict)
    victims: list[dict[str, Any]] = field(default_factory=list)  # ranks that failed because a culprit did
    time: float = field(default_factory=time.time)  # when the verdict was given

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "code": self.code,
            "verdict": ExitCode(self.code).name.lower() if self.code in ExitCode._value2member_map_ else str(self.code),
            "message": self.message,
            "culprits": self.culprits,
            "victims": self.victims,
            "evidence": self.evidence,
            "time": self.time,
        }


def _ranges(ranks: list[int]) -> str:
    """`0-3,7` for messages (the CPU-list notation)."""
    return format_cpulist(ranks)


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
) -> Verdict:
    """Decide whether the rendezvous may complete.

    `records` maps rank -> its registration (first claimant), `duplicates`
    rank -> records of later claimants, `errors` rank -> an error the rank
    reported before it could register, `log_errors` rank -> the first line
    it wrote to its node log (for ranks that could not even reach the store).
    A missing rank with an error is a culprit; missing ranks without one
    either never arrived (a hang: culprits) or were stopped with the culprit.
    """
    errors = errors or {}
    log_errors = log_errors or {}
    problems: list[str] = []
    culprits: list[dict[str, Any]] = []

    def host_of(rank: int) -> str:
        slot = rank // gpus_per_node
        return hosts[slot] if slot < len(hosts) else "?"

    # Preflight failures first: they name nodes to exclude.
    preflight: dict[str, list[str]] = defaultdict(list)
    for rank, rec in sorted(records.items()):
        if rec.get("token") != token:
            continue  # a stale process: reported as such below, its checks say nothing of this attempt
        for check in rec.get("preflight", []):
            if not check.get("ok", True):
                preflight[rec.get("host", host_of(rank))].append(f"rank {rank} {check['name']}: {check['detail']}")
                culprits.append({"rank": rank, "host": rec.get("host"), "reason": f"preflight {check['name']}"})
    if preflight:
        lines = [f"{host}: {'; '.join(items)}" for host, items in sorted(preflight.items())]
        return Verdict(
            False,
            int(ExitCode.PREFLIGHT_FAILED),
            f"preflight failed on {len(preflight)} node(s): " + " | ".join(lines),
            culprits,
            {"nodes": sorted(preflight)},
        )

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

    for rank, extra in sorted(duplicates.items()):
        first = records.get(rank, {})
        who = [f"pid {r.get('pid')} on {r.get('host')}" for r in [first, *extra]]
        problems.append(f"rank {rank} registered {len(who)} times: {', '.join(who)}")
        culprits += [{"rank": rank, "host": r.get("host"), "reason": "duplicate rank"} for r in extra]

    for rank, rec in sorted(records.items()):
        host = rec.get("host")
        if rec.get("token") != token:
            problems.append(
                f"rank {rank} (pid {rec.get('pid')} on {host}) carries another attempt's token: a stale process"
            )
            culprits.append({"rank": rank, "host": host, "reason": "stale attempt"})
        if rec.get("world_size") != world_size:
            problems.append(f"rank {rank} on {host} was started with WORLD_SIZE={rec.get('world_size')}, the plan has {world_size}")
            culprits.append({"rank": rank, "host": host, "reason": "wrong world size"})
        expected = host_of(rank)
        if host != expected:
            problems.append(f"rank {rank} runs on {host}, the plan puts it on {expected}")
            culprits.append({"rank": rank, "host": host, "reason": "wrong node"})

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

    if problems:
        return Verdict(False, int(ExitCode.RENDEZVOUS_FAILED), "rendezvous failed: " + " | ".join(problems), culprits)
    return Verdict(True, 0, f"all {world_size} ranks registered and checked")
