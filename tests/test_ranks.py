"""Parallel groups equal Megatron-Core's for any dims.

Two references: an independent coordinate-based computation written here
(ranks sharing their coordinates on every other axis form a group), and
Megatron-Core's own RankGenerator when megatron-core imports (the test set-up
installs it; it needs torch).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.plan.ranks import GROUP_KINDS, ORDER, RankLayout

SMALL = st.sampled_from([1, 2, 3, 4])


def reference_groups(sizes: tuple[int, ...], axes: tuple[str, ...]) -> list[list[int]]:
    """Group ranks by their coordinates on the axes outside `axes`."""
    world = 1
    for s in sizes:
        world *= s
    buckets: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for rank in range(world):
        coords = []
        rest = rank
        for size in sizes:
            coords.append(rest % size)
            rest //= size
        key = tuple(c for c, name in zip(coords, ORDER) if name not in axes)
        buckets[key].append(rank)
    return sorted((sorted(members) for members in buckets.values()), key=lambda g: g[0])


@st.composite
def layouts(draw: st.DrawFn) -> RankLayout:
    tp, cp, dp, pp = draw(SMALL), draw(SMALL), draw(SMALL), draw(SMALL)
    divisors = [e for e in range(1, dp * cp + 1) if (dp * cp) % e == 0]
    return RankLayout(tp=tp, cp=cp, dp=dp, pp=pp, ep=draw(st.sampled_from(divisors)))


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_groups_match_coordinate_reference(layout: RankLayout) -> None:
    for kind, (generator, axes) in GROUP_KINDS.items():
        assert layout.groups(kind) == reference_groups(layout.sizes(generator), axes), kind


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_every_kind_partitions_the_world(layout: RankLayout) -> None:
    for kind in GROUP_KINDS:
        groups = layout.groups(kind)
        flat = sorted(itertools.chain.from_iterable(groups))
        assert flat == list(range(layout.world)), kind
        assert len({len(g) for g in groups}) == 1, kind


def test_known_layout_tp2_dp2_pp2() -> None:
    """The example from Megatron-Core's docs: 8 ranks, tp 2, pp 2, dp 2."""
    layout = RankLayout(tp=2, dp=2, pp=2)
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("mp") == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_coordinates_agree_with_groups() -> None:
    layout = RankLayout(tp=2, cp=2, dp=3, pp=2, ep=2)
    for kind, axis in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("ep", "ep")):
        for group in layout.groups(kind):
            assert [layout.coordinates(r)[axis] for r in group] == list(range(len(group))), (kind, group)




@pytest.fixture(scope="module")
def rank_generator():  # noqa: ANN201 - megatron's class
    try:
        from megatron.core.parallel_state import RankGenerator
    except Exception as exc:  # noqa: BLE001 - any import failure means no reference
        pytest.skip(f"megatron-core is not importable here ({exc})")
    return RankGenerator


MEGATRON_TOKENS = {
    "tp": ("decoder", "tp"),
    "cp": ("decoder", "cp"),
    "dp": ("decoder", "dp"),
    "pp": ("decoder", "pp"),
    "tp_cp": ("decoder", "tp-cp"),
    "dp_cp": ("decoder", "dp-cp"),
    "mp": ("decoder", "tp-pp"),
    "ep": ("expert", "ep"),
    "edp": ("expert", "dp"),
    "tp_ep": ("expert", "tp-ep"),
}


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_groups_equal_megatron_core(rank_generator, layout: RankLayout) -> None:  # noqa: ANN001
    order = "-".join(ORDER)
    decoder = rank_generator(tp=layout.tp, ep=1, dp=layout.dp, pp=layout.pp, cp=layout.cp, order=order)
    expert = rank_generator(tp=layout.tp, ep=layout.ep, dp=layout.edp, pp=layout.pp, cp=1, order=order)
    generators = {"decoder": decoder, "expert": expert}
    assert set(MEGATRON_TOKENS) == set(GROUP_KINDS)
    for kind, (generator, token) in MEGATRON_TOKENS.items():
        assert layout.groups(kind) == generators[generator].get_ranks(token), kind
