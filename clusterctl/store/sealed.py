"""Values in the rendezvous store that only a holder of the attempt's token can have written.

torch's TCPStore has no authentication: whoever reaches its port can set,
append to or delete any key. Every value the controller or a rank acts on
(a registration, the rendezvous verdict, the stop request, the post-check
outcome, a rank's error report, the lists several ranks append to) is
therefore sealed: an HMAC-SHA256 made with the attempt's token over the key
and the value travels with it, and a reader takes a value whose seal does
not verify for absent. The seal binds a value to its key, so one rank's
sealed error cannot be replayed under another rank's key. The token itself
never reaches the store.

    seal(token, key, value)        value + SEP + 64 hex digits
    unseal(token, key, raw)        the value, or None (no seal, a wrong one, no token)
    item(token, key, text)         one entry of a list many writers append to: "text~<32 hex>,"
    items(token, key, raw)         the entries whose seals verify, in order

The keys torch itself uses (the process group's) are not ours to seal; an
operator keeps strangers from the port (docs/admin/shared.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from clusterctl import envnames

SEP = b"\x1f"  # the unit separator: never in compact JSON nor in a list entry
ITEM_SEP = "~"
ITEM_MAC_HEX = 32  # 128 bits for an entry: a forger needs a guess of that many


def _mac(token: str, key: str, value: bytes) -> str:
    return hmac.new(token.encode(), b"store|" + key.encode() + b"|" + value, hashlib.sha256).hexdigest()


def seal(token: str, key: str, value: bytes | str) -> bytes:
    """`value` with the seal that ties it to `key` and this attempt's token."""
    data = value.encode() if isinstance(value, str) else bytes(value)
    return data + SEP + _mac(token, key, data).encode()


def unseal(token: str, key: str, raw: bytes | None) -> bytes | None:
    """The value a holder of the token sealed under `key`; None for anything else."""
    if not token or raw is None:
        return None
    data, sep, tag = bytes(raw).rpartition(SEP)
    if not sep or not hmac.compare_digest(_mac(token, key, data).encode(), tag):
        return None
    return data


def read(store: Any, token: str, key: str) -> bytes | None:
    """The sealed value under `key` now, without waiting: None while there is none, or only another's."""
    return unseal(token, key, store.get(key)) if store.check([key]) else None


def rank_token() -> str:
    """This rank's attempt token, from its environment (where the launcher put it, never a file)."""
    return os.environ.get(envnames.TOKEN, "")


def strip(raw: bytes) -> bytes:
    """The value without whatever seal it carries (for what is shown of a value that failed `unseal`)."""
    data, sep, _ = bytes(raw).rpartition(SEP)
    return data if sep else bytes(raw)


def item(token: str, key: str, text: str) -> str:
    """One sealed entry of the comma-separated list under `key` (text without commas or `~`)."""
    return f"{text}{ITEM_SEP}{_mac(token, key, text.encode())[:ITEM_MAC_HEX]},"


def items(token: str, key: str, raw: bytes | None) -> list[str]:
    """The entries of the list under `key` that a holder of the token appended, in order (a stranger's, a torn
    one and anything unsealed are left out)."""
    if not token or not raw:
        return []
    found = []
    for entry in bytes(raw).decode(errors="replace").split(","):
        text, sep, tag = entry.rpartition(ITEM_SEP)
        if sep and hmac.compare_digest(_mac(token, key, text.encode())[:ITEM_MAC_HEX], tag):
            found.append(text)
    return found
