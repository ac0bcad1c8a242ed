"""Planning: everything decidable before the job starts, from (spec, site).

`ranks` is standard library only (the node side computes group membership
with it); `make_plan` and `Plan` need the pydantic models and load lazily so
that importing `clusterctl.plan.ranks` on a compute node stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterctl.plan.planner import Dims, Plan, make_plan

__all__ = ["Dims", "Plan", "make_plan"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from clusterctl.plan import planner

        return getattr(planner, name)
    raise AttributeError(name)
