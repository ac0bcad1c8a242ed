"""Rank order and parallel groups, built the way Megatron-Core builds them.

Ranks are laid out in the order `tp-cp-ep-dp-pp` (tp fastest), and a group
of kind `a-b` holds the ranks that differ only along axes a and b. Decoder
groups come from (tp, cp, dp, pp) with ep = 1; expert groups from
(etp = tp, ep, edp = world / (tp * ep * pp), pp) with cp = 1 — exactly the
two RankGenerators of Megatron-Core's `initialize_model_parallel`, so a
launcher and a Megatron trainer agree on who talks to whom.
"""

from __future__ import annotations

from dataclasses import dataclass

ORDER = ("tp", "cp", "ep", "dp", "pp")

# group kind -> (generator, axes). "decoder" uses (tp, cp, 1, dp, pp);
# "expert" uses (tp, 1, ep, edp, pp).
GROUP_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("decoder", ("tp",)),
    "cp": ("decoder", ("cp",)),
    "dp": ("decoder", ("dp",)),
    "pp": ("decoder", ("pp",)),
    "tp_cp": ("decoder", ("tp", "cp")),
    "dp_cp": ("decoder", ("dp", "cp")),
    "mp": ("decoder", ("tp", "pp")),
    "ep": ("expert", ("ep",)),
    "edp": ("expert", ("dp",)),
    "tp_ep": ("expert", ("tp", "ep")),
}


def orthogonal_groups(sizes: tuple[int, ...], mask: tuple[bool, ...]) -> list[list[int]]:
    """All groups that vary along the masked axes, as Megatron orders them.

    Axis 0 is fastest. Group g's members are base(g) + offset(i), where the
    offsets enumerate the masked axes and the bases the unmasked ones, each
    with the first axis varying fastest. O(world) and no per-rank division.
    """
    offsets = [0]
    bases = [0]
    stride = 1
    for size, masked in zip(sizes, mask):
        if masked:
            offsets = [o + k * stride for k in range(size) for o in offsets]
        else:
            bases = [b + k * stride for k in range(size) for b in bases]
        stride *= size
    return [[b + o for o in offsets] for b in bases]


@dataclass(frozen=True)
class RankLayout:
    """Parallel sizes of one job; world = tp * cp * dp * pp."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: world / (etp * ep * pp), with etp = tp."""
        return self.world // (self.tp * self.ep * self.pp)

    def sizes(self, generator: str) -> tuple[int, ...]:
        if generator == "decoder":
            return (self.tp, self.cp, 1, self.dp, self.pp)
        return (self.tp, 1, self.ep, self.edp, self.pp)

    def groups(self, kind: str) -> list[list[int]]:
        """Rank lists of one group kind (see GROUP_KINDS)."""
        generator, axes = GROUP_KINDS[kind]
        mask = tuple(axis in axes for axis in ORDER)
        return orthogonal_groups(self.sizes(generator), mask)

    def coordinates(self, rank: int) -> dict[str, int]:
        """A rank's position along each decoder axis (and its ep index)."""
        coords = {}
        rest = rank
        for axis, size in zip(ORDER, self.sizes("decoder")):
            coords[axis] = rest % size
            rest //= size
        coords["ep"] = (rank // self.tp) % self.ep
        return coords
