"""The reference PyTorch trainer and the recovery contract a user's script can adopt.

`Contract` is the few-lines API (checkpoint schedule, resume, pre-timeout
stop, heartbeats); `python -m clusterctl.trainer` runs the reference loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterctl.trainer.contract import Contract

__all__ = ["Contract"]


def __getattr__(name: str) -> Any:
    if name == "Contract":
        from clusterctl.trainer.contract import Contract

        return Contract
    raise AttributeError(name)
