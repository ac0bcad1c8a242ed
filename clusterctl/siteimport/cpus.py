"""Giving GPUs that share a socket's CPUs disjoint CPU sets.

`nvidia-smi topo -m` prints each GPU's CPU affinity: every CPU of its NUMA
node, the same list for all GPUs on that node (typically `0-55,112-167` for
the four GPUs of socket 0 of a DGX H100). A site config binds each rank to
its own CPUs, and `site validate` rejects overlapping sets, so the importer
splits each shared list between the GPUs that share it.

The rule (documented in docs/admin/sites.md):

1. GPUs whose CPU lists overlap form a group; the group's CPUs are the union.
2. The CPUs are grouped into physical cores. On a live node the kernel says
   which CPUs are SMT siblings (`thread_siblings_list`). From text alone the
   Linux x86 numbering is assumed: the second hardware thread of core c is
   CPU c + N for one offset N. A list such as `0-55,112-167` has one gap
   clearly larger than any other, and the CPUs above the gap mirror those
   below it at a single offset (here 112): those are the siblings. A list
   without that shape (`0-71`, `4,6,8,10,12`) is taken as one CPU per core.
3. The cores, in order, are dealt out in contiguous shares, one share per
   GPU in GPU index order; shares differ by at most one core, the first GPUs
   taking the extra ones. Each GPU gets its cores with all their siblings.

So `0-55,112-167` shared by GPUs 0-3 gives GPU 0 `0-13,112-125`, GPU 1
`14-27,126-139`, GPU 2 `28-41,140-153` and GPU 3 `42-55,154-167`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class CpuSplitError(ValueError):
    """More GPUs than CPUs to share among them."""


def sibling_offset(cpus: frozenset[int] | set[int]) -> int | None:
    """The SMT sibling offset N a CPU list shows (CPU c and c+N on one core), or None."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return None
    gaps = [(ordered[i + 1] - ordered[i], i) for i in range(len(ordered) - 1)]
    widest = max(gap for gap, _ in gaps)
    if widest <= 1 or sum(1 for gap, _ in gaps if gap == widest) != 1:
        return None
    cut = next(i for gap, i in gaps if gap == widest)
    lower, upper = ordered[: cut + 1], ordered[cut + 1 :]
    offset = upper[0] - lower[0]
    below = set(lower)
    mirrored = sum(1 for cpu in upper if cpu - offset in below)
    if mirrored < 0.75 * max(len(lower), len(upper)) or upper[-1] - offset > lower[-1] + 1:
        return None
    return offset


def cores_of(cpus: frozenset[int], siblings: Mapping[int, frozenset[int]] | None = None) -> list[frozenset[int]]:
    """The CPUs grouped by physical core, cores in the order of their first thread."""
    groups: dict[int, set[int]] = {}
    if siblings:
        for cpu in cpus:
            groups.setdefault(min(siblings.get(cpu, frozenset({cpu}))), set()).add(cpu)
    else:
        offset = sibling_offset(cpus)
        boundary = min(cpus) + offset if offset is not None else None
        for cpu in cpus:
            key = cpu - offset if offset is not None and boundary is not None and cpu >= boundary else cpu
            groups.setdefault(key, set()).add(cpu)
    # A core is keyed by its first thread, so cores keep their order even when a first thread is missing.
    return [frozenset(groups[k]) for k in sorted(groups)]


def split_cpus(
    cpus: frozenset[int], shares: int, siblings: Mapping[int, frozenset[int]] | None = None
) -> list[frozenset[int]]:
    """`cpus` dealt into `shares` disjoint sets of whole cores, contiguous, sizes differing by at most one core."""
    if shares < 1:
        raise ValueError("shares must be positive")
    units = cores_of(cpus, siblings)
    if len(units) < shares:
        units = [frozenset({cpu}) for cpu in sorted(cpus)]
    if len(units) < shares:
        raise CpuSplitError(f"{shares} GPUs share {len(cpus)} CPU(s); each GPU needs at least one of its own")
    base, extra = divmod(len(units), shares)
    out: list[frozenset[int]] = []
    start = 0
    for share in range(shares):
        size = base + (1 if share < extra else 0)
        out.append(frozenset().union(*units[start : start + size]))
        start += size
    return out


def disjoint_sets(
    lists: Sequence[frozenset[int] | None], siblings: Mapping[int, frozenset[int]] | None = None
) -> list[frozenset[int] | None]:
    """Per GPU (in index order): its own CPUs, overlapping lists split by the rule above; None stays None."""
    parent = list(range(len(lists)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a in range(len(lists)):
        for b in range(a + 1, len(lists)):
            la, lb = lists[a], lists[b]
            if la is not None and lb is not None and la & lb:
                parent[root(b)] = root(a)
    groups: dict[int, list[int]] = {}
    for i, cpus in enumerate(lists):
        if cpus is not None:
            groups.setdefault(root(i), []).append(i)
    out: list[frozenset[int] | None] = list(lists)
    for members in groups.values():
        if len(members) == 1:
            continue
        union = frozenset().union(*(lists[i] or frozenset() for i in members))
        for gpu, share in zip(sorted(members), split_cpus(union, len(members), siblings)):
            out[gpu] = share
    return out
