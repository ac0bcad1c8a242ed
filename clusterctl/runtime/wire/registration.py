"""Registration: the keys ranks and the controller share in the store, and the records ranks write there.

Every rank claims its rank number, writes one registration record and bumps
a counter; the controller, woken by the counter, waits until every rank's
record is there (anyone can move a counter), reads the records and judges
them (runtime/controller/admission.py). A stored record is a short summary line (what
the judgement reads) followed by the full record (what manifest.json keeps),
so 100,000 registrations are judged without decoding them whole. Every value
is sealed with the attempt's token (runtime/wire/sealed.py): a record a
stranger wrote or rewrote (its preflight results, say) reads as one written
without the token.
"""

from __future__ import annotations

import json
from typing import Any

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.verdict import Verdict
from clusterctl.store import sealed

PREFIX = "clusterctl/"
ARRIVED = PREFIX + "arrived"
VERDICT = PREFIX + "verdict"
DUPLICATES = PREFIX + "duplicates"  # appended "rank:claim" (sealed entries) by every claimant after the first
ERRORED = PREFIX + "errored"  # appended "rank" (sealed) by every rank that wrote error_key(rank)
POSTCHECK = PREFIX + "postcheck"  # rank 0's outcome of the comm/compute checks (sealed)
POST_RENDEZVOUS: tuple[str, ...] = ("comm", "compute")  # the checks whose outcome comes as POSTCHECK
STOP = PREFIX + "stop"  # set (sealed) by the controller when the batch shell asks the ranks to save and stop
RETURNED = PREFIX + "returned"  # appended "rank:code" (sealed) by every rank whose command returned (0, or 85 on request)
DIRECT = PREFIX + "direct"  # appended "rank" (sealed) by a rank of a node of several that registered on its own


def parse_returned(raw: bytes | None, token: str, world: int) -> dict[int, int]:
    """RETURNED's sealed "rank:code" entries as rank -> code (a torn, foreign or unsealed entry is skipped)."""
    found: dict[int, int] = {}
    for entry in sealed.items(token, RETURNED, raw):
        rank, _, code = entry.partition(":")
        if rank.isdigit() and code.isdigit() and int(rank) < world:
            found[int(rank)] = int(code)
    return found


def parse_ranks(raw: bytes | None, token: str, world: int, key: str = ERRORED) -> list[int]:
    """A list of sealed "rank" entries (ERRORED's, DIRECT's): the ranks of this world, each once, in order (whatever
    else anyone wrote is skipped: the store takes any client's writes, and one bad entry must not crash the
    controller)."""
    found: dict[int, None] = {}
    for entry in sealed.items(token, key, raw):
        if entry.isdigit() and int(entry) < world:
            found.setdefault(int(entry))
    return list(found)


def parse_claims(raw: bytes | None, token: str, world: int) -> list[tuple[int, int]]:
    """DUPLICATES's sealed "rank:claim" entries as (rank, claim), a later claimant's (claim >= 2) of a rank of this
    world; anything else is skipped."""
    found: dict[tuple[int, int], None] = {}
    for entry in sealed.items(token, DUPLICATES, raw):
        rank, _, claim = entry.partition(":")
        if rank.isdigit() and claim.isdigit() and int(rank) < world and int(claim) >= 2:
            found.setdefault((int(rank), int(claim)))
    return list(found)


def claim_key(rank: int) -> str:
    return f"{PREFIX}claim/{rank}"


def reg_key(rank: int, claim: int = 1) -> str:
    """The first claimant's record; later claimants (duplicates) write under their claim number."""
    return f"{PREFIX}reg/{rank}" if claim == 1 else f"{PREFIX}reg/{rank}/dup{claim}"


def node_key(slot: int) -> str:
    """A node's registrations, stored at once by its first rank (encode_node)."""
    return f"{PREFIX}node/{slot}"


def encode_node(payloads: dict[int, bytes]) -> bytes:
    """One node's registrations as its first rank stores them: a line of [rank, length] pairs, then the ranks'
    own sealed values (`sealed_registration`) one after another, each exactly as the rank would have stored it."""
    ranks = sorted(payloads)
    head = json.dumps([[r, len(payloads[r])] for r in ranks], separators=(",", ":")).encode()
    return b"".join([head, b"\n", *(payloads[r] for r in ranks)])


def decode_node(raw: bytes) -> dict[int, bytes]:
    """rank -> its sealed registration from a node's value; {} for one that is not in that form (a stranger's
    value there: the node's ranks then register one by one, and are read so)."""
    cut = raw.find(b"\n")
    try:
        pairs = json.loads(raw[:cut]) if cut > 0 else None
    except (ValueError, RecursionError):
        return {}
    if not isinstance(pairs, list):
        return {}
    found: dict[int, bytes] = {}
    at = cut + 1
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int and v >= 0 for v in pair)):
            return {}
        rank, size = pair
        found[rank] = raw[at : at + size]
        at += size
    return found if at == len(raw) else {}


def error_key(rank: int) -> str:
    return f"{PREFIX}error/{rank}"


VERSION_KEYS = ("torch", "cuda", "nccl", "hip")
JUDGED = ("rank", "world_size", "host", "pid", "proof", "gpu", "versions", "fabric")  # what judge() and the end's blame read
def verdict_body(verdict: Verdict) -> str:
    """The rendezvous verdict as the controller publishes it under VERDICT (sealed): verdict.json's own record."""
    return json.dumps(verdict.as_dict())


def read_verdict(body: bytes | str) -> Verdict:
    """The ranks' reading of VERDICT's (unsealed) body: a Verdict, never a raw dict."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return Verdict(False, int(ExitCode.RENDEZVOUS_FAILED), "the controller's rendezvous verdict could not be read")
    return Verdict.from_dict(data)


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


def sealed_registration(token: str, rank: int, claim: int, record: dict[str, Any]) -> bytes:
    """What a rank stores under reg_key(rank, claim): `encode_registration`, sealed for that key."""
    return sealed.seal(token, reg_key(rank, claim), encode_registration(record))


def summary_only(token: str, rank: int, payload: bytes) -> bytes:
    """A rank's sealed registration cut to its summary line, sealed for the same key: what a node's value carries.
    The controller judges summaries alone, and the full records (~1.7 KB a rank, 7x the summary) reach
    manifest.json through the node's file instead: 175 MB less for the store's one thread at 100,000 ranks. A value
    that is not a sealed two-line registration is left whole."""
    body = sealed.unseal(token, reg_key(rank), payload)
    cut = _summary_cut(body) if body is not None else None
    return sealed.seal(token, reg_key(rank), body[:cut]) if cut is not None else payload


def open_registration(token: str, rank: int, claim: int, raw: bytes) -> tuple[dict[str, Any], bytes | memoryview]:
    """`decode_registration` of a stored, sealed record. One whose seal fails (written or rewritten without the
    token) keeps no proof: admission judges it a stale or forged registration, whatever it claims."""
    body = sealed.unseal(token, reg_key(rank, claim), raw)
    if body is not None:
        return decode_registration(body)
    head, full = decode_registration(sealed.strip(raw))
    head.pop("proof", None)
    return head, full


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
    raw = sealed.strip(raw)
    cut = _summary_cut(raw)
    return memoryview(raw)[cut + 1 :] if cut is not None else decode_registration(raw)[1]


def share_values(head: dict[str, Any], seen: dict[Any, Any]) -> dict[str, Any]:
    """One object for values that most ranks repeat (host, versions): less memory at 100,000 ranks.

    The shared objects are only read (judge, blame), never changed.
    """
    for key in ("host",):  # each rank's proof is its own
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
