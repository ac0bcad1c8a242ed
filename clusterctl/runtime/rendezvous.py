"""The rank's side of the rendezvous: register with the controller, wait for its verdict.

One TCPStore client per rank, to the store the controller hosts; the
process group created afterwards (env:// with TORCHELASTIC_USE_AGENT_STORE)
connects to the same store, so there is one rendezvous, not two.
"""

from __future__ import annotations

import json
import traceback
from datetime import timedelta
from typing import Any

from clusterctl.runtime import registry
from clusterctl.runtime.rankinfo import RankInfo

VERDICT_GRACE_S = 30  # the controller judges at its deadline; allow it time to answer

CURRENT_STORE: Any = None
"""The rank's client of the controller's store, once registered (None outside a managed attempt)."""


def connect(info: RankInfo, timeout_s: float):  # noqa: ANN201 - torch type
    from torch.distributed import TCPStore

    return TCPStore(
        info.master_addr,
        info.master_port,
        world_size=info.world_size,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        use_libuv=True,
    )


def register(store: Any, rank: int, record: dict[str, Any]) -> int:
    """Claim the rank and publish the record; returns the claim number (1 unless a duplicate)."""
    claim = int(store.add(registry.claim_key(rank), 1))
    store.set(registry.reg_key(rank, claim), json.dumps(record))
    if claim == 1:
        store.add(registry.ARRIVED, 1)
    else:
        store.append(registry.DUPLICATES, f"{rank}:{claim},")
    return claim


def await_verdict(store: Any, timeout_s: float) -> dict[str, Any]:
    store.wait([registry.VERDICT], timedelta(seconds=timeout_s + VERDICT_GRACE_S))
    return json.loads(store.get(registry.VERDICT))


def report_error(store: Any, rank: int, text: str, *, script_failed: bool) -> None:
    """Tell the controller what went wrong on this rank (best effort: the store may be gone)."""
    try:
        store.set(registry.error_key(rank), text[-20000:])
        store.append(registry.ERRORED, f"{rank},")
        if script_failed:
            store.add(registry.FAILED, 1)
    except Exception:  # noqa: BLE001 - reporting must never mask the original error
        traceback.print_exc()
