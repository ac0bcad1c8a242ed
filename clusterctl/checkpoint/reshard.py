"""Which saved rank's extra a rank gets back when the world changed shape.

Tensor state reshards inside DCP (replicated tensors load anywhere; DTensors
are re-cut for the new mesh). Per-rank extras are small facts kept per rank:

- same world size and layout: rank r gets rank r's extra;
- only the data-parallel size changed and the layout names the dimensions
  (tp, cp, dp, pp; rank order tp fastest, then cp, dp, pp, Megatron's
  default): rank r keeps its tp/cp/pp coordinates and takes dp coordinate
  `dp % saved_dp`, so a model-parallel peer group is mapped onto a saved one;
- anything else: rank r takes saved rank `r % saved_world_size`.

Ranks that existed before keep their own facts whenever the mapping allows.
A rank beyond the saved world borrows another rank's facts; in particular its
RNG state then duplicates a peer's, so a trainer that resumes under a new
world size should re-derive per-rank RNG from (seed, step, rank) and take the
data position as a global fact (the manifest's `data_position`).
"""

from __future__ import annotations

from typing import Any

_DIMS = ("tp", "cp", "dp", "pp")


def _dims(layout: dict[str, Any] | None, world_size: int) -> dict[str, int] | None:
    """tp, cp, dp, pp from a layout when they multiply to the world size."""
    if not layout or "dp" not in layout:
        return None
    try:
        dims = {d: int(layout.get(d) or 1) for d in _DIMS}
    except (TypeError, ValueError):
        return None
    product = dims["tp"] * dims["cp"] * dims["dp"] * dims["pp"]
    return dims if product == world_size else None


def source_rank(
    rank: int,
    world_size: int,
    layout: dict[str, Any] | None,
    saved_world_size: int,
    saved_layout: dict[str, Any] | None,
) -> int:
    """The saved rank whose extra `rank` should load (see the module docstring)."""
    if world_size == saved_world_size and (layout or {}) == (saved_layout or {}):
        return rank
    now, then = _dims(layout, world_size), _dims(saved_layout, saved_world_size)
    if now and then and all(now[d] == then[d] for d in ("tp", "cp", "pp")):
        tp, rest = rank % now["tp"], rank // now["tp"]
        cp, rest = rest % now["cp"], rest // now["cp"]
        dp, pp = rest % now["dp"], rest // now["dp"]
        src_dp = dp % then["dp"]
        return tp + then["tp"] * (cp + then["cp"] * (src_dp + then["dp"] * pp))
    return rank % saved_world_size


def map_extra(manifest: dict[str, Any], rank: int, world_size: int, layout: dict[str, Any] | None) -> dict[str, Any]:
    """This rank's extra from a manifest, mapped by `source_rank`."""
    src = source_rank(rank, world_size, layout, int(manifest["world_size"]), manifest.get("layout"))
    return manifest["ranks"][src]
