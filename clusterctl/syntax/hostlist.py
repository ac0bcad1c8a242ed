"""Slurm hostlist expressions (`gpu-[001-004,010]`), as `scontrol` reads and writes them.

Slurm hands every job its nodes as a compressed hostlist (`SLURM_JOB_NODELIST`).
The launcher must turn that into exactly the host names, in exactly the order,
that Slurm means: rank 0, the rendezvous host and the per-node ranks all come
from that order. `scontrol` is not always on compute nodes or inside
containers, so this module reimplements it with the standard library only.

Behaviour is pinned to `scontrol show hostnames` / `scontrol show hostlist`
(checked against Slurm 22.05; see tests/test_hostlist.py):

* Items are separated by commas or whitespace outside brackets; empty items
  (`a,,b`) are skipped. Duplicates and the given order are kept.
* An item without brackets is a literal host name (`node-a-1`, `login`).
* `prefix[ranges]` expands each range in turn: `n[3,1-2]` is n3 n1 n2. A range
  is `N` or `N-M` (decimal, `N <= M`) and every number in it is zero-padded to
  the width of `N` as written: `[08-10]` gives 08 09 10, `[9-11]` gives 9 10 11,
  `[1-010]` gives 1 .. 10 (the width of `M` is ignored), `[009-11]` 009 010 011.
* Several bracket groups are allowed (`rack[1-2]-n[01-02]`), but a name must end
  with a bracket group: `n[1-2]x` is an error, as in Slurm. Slurm's order for
  groups G1..Gk is not plain nesting: Gk varies fastest, then G1, G2, .., and
  G(k-1) slowest. With two groups that is the natural order; with three,
  `a[1-2]b[3-4]c[5-6]` gives a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ...

Where `scontrol` accepts input only to produce nonsense, this module raises
`HostlistError` instead: unbalanced or nested brackets (`n[1-3` expands to
`n]` in Slurm), `]` in a name, whitespace, signs or other junk inside brackets
(`n[1, 2]` gives n1 n02, `n[1a-3]` n01 n02 n03), open ranges (`n[1-]` gives
n1), and bad ranges in any but the last two groups of a name, which Slurm
silently drops (`n1,a[x]b[1]c[1]` gives just n1). Two deliberate differences
the other way: any whitespace separates items (Slurm only splits on space and
tab and keeps a newline inside the name), and a range may hold more than
Slurm 22.05's 65536 hosts, up to `MAX_HOSTS` in total, so that 100k-node lists
work. Numbers in brackets must fit in 64 bits (Slurm silently clips larger ones).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MAX_HOSTS", "HostlistError", "compress", "count", "expand", "first"]

MAX_HOSTS = 1 << 20
"""Most hosts one expression may describe: a guard against typos like `n[1-1000000000]`."""

_ULONG_MAX = (1 << 64) - 1  # Slurm parses numbers with strtoul
_WHITESPACE = " \t\n\r\v\f"
_SEPARATORS = frozenset(_WHITESPACE + ",")
_DIGITS = "0123456789"

# A top-level item: runs of ordinary characters and complete, unnested bracket groups.
_ITEM = re.compile(rf"(?:[^\[\],{re.escape(_WHITESPACE)}]++|\[[^\[\]]*+\])++")
_GROUP = re.compile(r"\[([^\]]*)\]")
_BODY = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*+")
_BAD_NAME_CHAR = re.compile(rf"[\[\],{re.escape(_WHITESPACE)}]")


class HostlistError(ValueError):
    """A hostlist expression Slurm would reject, or would read as something else."""


# One range of a bracket group: (lo, hi, width), printed as "%0{width}d".
_Range = tuple[int, int, int]
# A parsed item: a literal host name, or (texts, groups) where the hosts are
# texts[0] + g0 + texts[1] + g1 + ... + texts[k-1] + g(k-1), texts[k] being "".
_Pattern = tuple[tuple[str, ...], tuple[tuple[_Range, ...], ...]]
_Item = str | _Pattern


def _fail(expr: str, reason: str) -> HostlistError:
    shown = expr if len(expr) <= 120 else expr[:100] + "..."
    return HostlistError(f"invalid hostlist {shown!r}: {reason}")


def _bracket_problem(expr: str, pos: int) -> str:
    if expr[pos] == "]":
        return f"unmatched ']' at position {pos}"
    close = expr.find("]", pos + 1)
    if close < 0:
        return f"unclosed '[' at position {pos}"
    inner = expr.find("[", pos + 1, close)
    return f"nested '[' at position {inner} (brackets cannot nest)"


def _range_problem(part: str) -> str:
    if not part:
        return "empty element in a range list"
    if any(c in _WHITESPACE for c in part):
        return f"whitespace inside brackets in {part!r}"
    if part.endswith("-"):
        return f"range {part!r} has no upper bound"
    if part.startswith("-"):
        return f"range {part!r} has no lower bound"
    return f"{part!r} is not a number or an N-M range of decimal numbers"


def _parse_group(expr: str, item: str, body: str) -> tuple[_Range, ...]:
    if not body:
        raise _fail(expr, f"empty brackets '[]' in {item!r}")
    parts = body.split(",")
    if _BODY.fullmatch(body) is None:
        bad = next(p for p in parts if _BODY.fullmatch(p) is None)
        raise _fail(expr, f"{_range_problem(bad)} in {item!r}")
    ranges = []
    for part in parts:
        lo_text, dash, hi_text = part.partition("-")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if hi < lo:
            raise _fail(expr, f"descending range {part!r} in {item!r}")
        if hi > _ULONG_MAX:
            raise _fail(expr, f"number in {part!r} does not fit in 64 bits in {item!r}")
        ranges.append((lo, hi, len(lo_text)))
    return tuple(ranges)


def _parse_item(expr: str, item: str) -> _Item:
    if "[" not in item:
        return item
    pieces = _GROUP.split(item)  # texts and group bodies alternate
    texts, bodies = pieces[0::2], pieces[1::2]
    if texts[-1]:
        raise _fail(
            expr,
            f"text {texts[-1]!r} after the last ']' in {item!r} "
            "(a name must end with its bracket group)",
        )
    groups = tuple(_parse_group(expr, item, body) for body in bodies)
    return tuple(texts), groups


def _parse(expr: str) -> list[_Item]:
    """Validate the whole expression and enforce MAX_HOSTS, without expanding anything."""
    if not isinstance(expr, str):
        raise TypeError(f"hostlist expression must be a str, not {type(expr).__name__}")
    items: list[_Item] = []
    total = 0
    pos = 0
    for match in itertools.chain(_ITEM.finditer(expr), [None]):
        start = len(expr) if match is None else match.start()
        for i in range(pos, start):
            if expr[i] not in _SEPARATORS:
                raise _fail(expr, _bracket_problem(expr, i))
        if match is None:
            break
        pos = match.end()
        item = _parse_item(expr, match.group())
        items.append(item)
        total += _item_count(item)
        if total > MAX_HOSTS:
            raise _fail(expr, f"describes more than MAX_HOSTS={MAX_HOSTS} hosts")
    return items


def _item_count(item: _Item) -> int:
    if isinstance(item, str):
        return 1
    count = 1
    for group in item[1]:
        count *= sum(hi - lo + 1 for lo, hi, _ in group)
    return count


def count(expr: str) -> int:
    """len(expand(expr)), without expanding anything."""
    return sum(_item_count(item) for item in _parse(expr))


def is_valid(expr: str) -> bool:
    """Whether `expr` parses as a hostlist (the error itself is reported where the field is checked)."""
    try:
        _parse(expr)
    except HostlistError:
        return False
    return True


def _expand_pattern(pattern: _Pattern) -> list[str]:
    texts, groups = pattern
    if len(groups) == 1:
        prefix = texts[0].replace("%", "%%")
        names: list[str] = []
        for lo, hi, width in groups[0]:
            fmt = prefix + "%0" + str(width) + "d"
            names.extend([fmt % i for i in range(lo, hi + 1)])
        return names
    values = [
        [f"{i:0{width}d}" for lo, hi, width in group for i in range(lo, hi + 1)] for group in groups
    ]
    last = len(groups) - 1
    # Slurm's nesting, slowest first: groups[k-2], ..., groups[0], then groups[k-1].
    order = [*range(last - 1, -1, -1), last]
    slot = [order.index(g) for g in range(len(groups))]
    names = []
    for combo in itertools.product(*(values[g] for g in order)):
        parts = [texts[0]]
        for g in range(len(groups)):
            parts.append(combo[slot[g]])
            parts.append(texts[g + 1])
        names.append("".join(parts))
    return names


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression into host names, exactly as `scontrol show hostnames`.

    Order and duplicates are kept, because Slurm's order decides which host gets
    which rank. An empty or all-separator expression gives []. Raises
    HostlistError naming the expression and the problem.
    """
    items = _parse(expr)
    names: list[str] = []
    for item in items:
        if isinstance(item, str):
            names.append(item)
        else:
            names.extend(_expand_pattern(item))
    return names


def first(expr: str) -> str:
    """Return the first host of an expression without expanding it.

    Cheap at any size (rank 0 and the rendezvous host are needed before
    anything else). The whole expression is still validated, so `first`
    raises exactly when `expand` would, and also when there are no hosts.
    """
    items = _parse(expr)
    if not items:
        raise _fail(expr, "no hosts in it")
    item = items[0]
    if isinstance(item, str):
        return item
    texts, groups = item
    parts = [texts[0]]
    for group, text in zip(groups, texts[1:], strict=True):
        lo, _, width = group[0]
        parts.append(f"{lo:0{width}d}")
        parts.append(text)
    return "".join(parts)


def _zero_pad(num: int, width: int) -> int:
    return max(width - len(str(num)), 0)


def _width_equiv(n: int, wn: int, m: int, wm: int) -> tuple[bool, int, int]:
    """Slurm's test whether two zero-pad widths can share one range, and the widths to use."""
    if wn == wm:
        return True, wn, wm
    npad, nmpad = _zero_pad(n, wn), _zero_pad(n, wm)
    mpad, mnpad = _zero_pad(m, wm), _zero_pad(m, wn)
    if npad != nmpad and mpad != mnpad:
        return False, wn, wm
    if npad != nmpad:
        return True, wn, wn
    return True, wm, wm


@dataclass(slots=True)
class _Run:
    prefix: str  # the whole name when numbered is False
    lo: int = 0
    hi: int = 0
    width: int = 0
    numbered: bool = True


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"host names must be str, not {type(name).__name__}")
    if not name:
        raise HostlistError("cannot compress an empty host name")
    bad = _BAD_NAME_CHAR.search(name)
    if bad:
        raise HostlistError(
            f"cannot compress host name {name!r}: it contains {bad.group()!r}, "
            "which a hostlist reads as a separator or bracket"
        )
    return name


def compress(names: Iterable[str]) -> str:
    """Compress host names into a hostlist, exactly as `scontrol show hostlist`.

    Like Slurm it neither sorts nor removes duplicates: only neighbours merge
    (`n1,n2,n3` -> `n[1-3]`, `n3,n1,n2` -> `n[3,1-2]`, `n1,x,n2` stays as is),
    so `expand(compress(names)) == names` for any list of valid names, and the
    rank order survives the round trip. Sort first for the shortest result.
    """
    if isinstance(names, str):
        raise TypeError("compress() takes a list of host names, not a str")
    runs: list[_Run] = []
    for name in names:
        _check_name(name)
        digits = len(name) - len(name.rstrip(_DIGITS))
        num = int(name[len(name) - digits :]) if digits else -1
        if num < 0 or num > _ULONG_MAX:
            runs.append(_Run(name, numbered=False))
            continue
        prefix = name[: len(name) - digits]
        # Only a neighbour merges, and only if no name's zero padding would
        # change: n9,n10 -> n[9-10] but n1,n02 -> n[1,02], as Slurm does.
        tail = runs[-1] if runs else None
        if tail is not None and tail.numbered and tail.prefix == prefix and tail.hi == num - 1:
            ok, tail_width, _ = _width_equiv(tail.lo, tail.width, num, digits)
            if ok:
                tail.width = tail_width
                tail.hi = num
                continue
        runs.append(_Run(prefix, num, num, digits))

    out: list[str] = []
    i = 0
    while i < len(runs):
        run = runs[i]
        if not run.numbered:
            out.append(run.prefix)
            i += 1
            continue
        j = i + 1
        while j < len(runs) and runs[j].numbered and runs[j].prefix == run.prefix:
            j += 1
        body = ",".join(_numstr(r) for r in runs[i:j])
        if j - i > 1 or run.hi > run.lo:
            body = "[" + body + "]"
        out.append(run.prefix + body)
        i = j
    return ",".join(out)


def _numstr(run: _Run) -> str:
    text = f"{run.lo:0{run.width}d}"
    if run.hi > run.lo:
        text += f"-{run.hi:0{run.width}d}"
    return text
