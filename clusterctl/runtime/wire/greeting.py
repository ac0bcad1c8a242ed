"""How a process proves it belongs to the attempt without giving away the attempt's secret.

A rank's registration carries `proof`, HMAC-SHA256(token, rank|host|pid),
never the token: the rendezvous store (torch's TCPStore) lets whoever reaches
its port read every key, so a token stored there would be anyone's, and a
registration written by a process without the token is judged a stale or
forged one.

The watch connection's greeting: a challenge from the controller, a hello bound to the attempt's secret,
and the controller's welcome once it heard the hello.

The attempt token never crosses the wire. The controller's first line on a
new connection is a fresh nonce; the aggregator answers with
HMAC-SHA256(token, nonce|node). A process that can reach the watch port but
cannot read the token (attempt-N/.token and the ranks' environment are their
owner's) cannot greet, so it can neither send beats nor end a connection
that would read as a lost node; a greeting seen on one connection does not
answer another's nonce, in this attempt or the next. Standard library only:
the aggregator imports it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

CHALLENGE = "challenge"
HELLO = "hello"
WELCOME = "welcome"  # the controller heard the hello: until then an aggregator is not in (a flood may crowd it out)


def challenge() -> tuple[str, bytes]:
    """A new connection's nonce, and the line that carries it."""
    nonce = secrets.token_hex(16)
    return nonce, (json.dumps({"kind": CHALLENGE, "nonce": nonce}) + "\n").encode()


def welcome_line(cap: int, detail: bool) -> bytes:
    """The controller's welcome, with how many phase changes and steps of each rank a batch may carry (`cap`: the
    controller's budget shared by the world) and whether every phase change is wanted (`detail`), for
    heartbeat.RankDigest."""
    return (json.dumps({"kind": WELCOME, "cap": cap, "detail": detail}) + "\n").encode()


def mac(token: str, nonce: str, node: str) -> str:
    return hmac.new(token.encode(), f"{nonce}|{node}".encode(), hashlib.sha256).hexdigest()


def hello(token: str, nonce: str, node: str, pid: int) -> bytes:
    """The aggregator's answer to a challenge: its node, its pid, the MAC (never the token)."""
    return (json.dumps({"kind": HELLO, "node": node, "pid": pid, "mac": mac(token, nonce, node)}) + "\n").encode()


def registration_proof(token: str, rank: int, host: str, pid: int) -> str:
    return hmac.new(token.encode(), f"registration|{rank}|{host}|{pid}".encode(), hashlib.sha256).hexdigest()


def registered_here(token: str, record: dict[str, Any]) -> bool:
    """Whether a registration was written by a process that holds this attempt's token."""
    proof, rank, host, pid = (record.get(k) for k in ("proof", "rank", "host", "pid"))
    if not isinstance(proof, str) or not isinstance(rank, int) or not isinstance(pid, int) or not token:
        return False
    return hmac.compare_digest(registration_proof(token, rank, str(host), pid), proof)


def verify(token: str, nonce: str, msg: dict[str, Any]) -> bool:
    """Whether `msg` is a hello that answers this nonce with this attempt's token."""
    given, node = msg.get("mac"), msg.get("node")
    if msg.get("kind") != HELLO or not isinstance(given, str) or not isinstance(node, str) or not token:
        return False
    return hmac.compare_digest(mac(token, nonce, node), given)
