"""Parse the text of `nvidia-smi topo -m` (or `-mp`) as people paste it.

The output is a matrix with one column per device (GPUs, then NICs) and,
on current drivers, `CPU Affinity`, `NUMA Affinity` and `GPU NUMA ID`
columns, followed by a legend and a `NIC Legend` that maps the NIC0, NIC1..
column names to device names (mlx5_0, mlx5_bond_0, ...). Older drivers name
the NICs in the header (`mlx5_0`) and print no NIC legend, and some print no
NUMA column. Cells between a GPU and another device are one of

    X      the device itself
    NV#    a bonded set of # NVLinks (GPU to GPU)
    PIX    at most one PCIe bridge            (closest)
    PXB    several PCIe bridges, no host bridge
    PHB    through a PCIe host bridge (the CPU)
    NODE   between host bridges of one NUMA node
    SYS    across the SMP interconnect between NUMA nodes (older drivers: SOC)

What pasted output does to it, and what this parser does about it:
terminal colour codes (nvidia-smi underlines the header on a terminal) are
stripped, also when a web page or chat dropped their ESC bytes and left
`[4mGPU0 ... NUMA Affinity[0m` behind (see `clean`); tabs, runs of spaces and cells that ran together because a column
overflowed (`NIC11NIC12`, `PIXNODE`) are all read; separator lines, the
legend and prose around the matrix are ignored; a `N NICs found ... only
displaying M` notice becomes a warning. Missing trailing columns (an empty
CPU affinity, no NUMA column) leave those facts unknown, for the caller to
fill in or reject. Anything that is not such a matrix is a ConfigError that
says what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterctl.errors import OMIT, ConfigError, Problem
from clusterctl.syntax.cpulist import parse_cpulist

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""GPU-to-NIC distances, closest first."""
LEVEL_RANK = {level: rank for rank, level in enumerate(LEVELS)}
_ALIASES = {"SOC": "SYS"}  # drivers before 2017 called cross-socket paths SOC

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# A colour code whose ESC was lost in a copy: `[4m`, `[0;4m`, `[m`; the ESC may have
# become the caret notation `^[` (cat -v, less) or the visible symbol U+241B.
_ORPHAN_SGR_RUN = re.compile(r"(?:(?:\^\[|\u241b)?\[[0-9;]*m)+")
_WORD = re.compile(r"\S+")
# What may sit on either side of an orphan colour code inside one word (`GPU0[0mGPU1`,
# `PIX[0mNODE`): device names, cells, the affinity columns' words and values.
_MATRIX_WORD = re.compile(
    r"(?:GPU\d+|NIC\d+|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|X|CPU|NUMA|GPU|Affinity|ID|N/A|[0-9][0-9,\-]*)+"
)
_CELL = r"NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|X"
_CELL_RUN = re.compile(rf"(?:{_CELL})+")
_CELL_ONE = re.compile(_CELL)
_DEVICE_RUN = re.compile(r"(?:GPU\d+|NIC\d+)+")
_DEVICE_ONE = re.compile(r"GPU\d+|NIC\d+")
_GPU = re.compile(r"GPU(\d+)")
_NIC_PLACEHOLDER = re.compile(r"NIC\d+")
_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_TRUNCATED = re.compile(r"(\d+)\s+NICs found in the topology,\s*only displaying\s+(\d+)", re.I)

EXPECTED = (
    "expected the output of `nvidia-smi topo -m`: a header line of device names starting with GPU0"
    " (GPU0 GPU1 ... NIC0 ... CPU Affinity NUMA Affinity), then one row per GPU (GPU0  X  NV18 ... PIX ...)"
)


@dataclass(frozen=True)
class TopoGpu:
    """One GPU row of the matrix."""

    index: int
    links: tuple[str, ...]  # to each GPU column: X, NV#, or a PCIe level
    nic_levels: tuple[str, ...]  # to each NIC column: PIX .. SYS
    cpus: frozenset[int] | None  # CPU Affinity (None: not printed)
    numa: tuple[int, ...]  # NUMA Affinity (several on some systems; empty: not printed)
    line: int


@dataclass(frozen=True)
class Topo:
    """The parsed matrix: GPUs, NIC names (legend applied), and what was odd about the text."""

    source: str
    gpus: tuple[TopoGpu, ...]
    nics: tuple[str, ...]
    has_cpu_column: bool
    has_numa_column: bool
    warnings: tuple[str, ...] = field(default=())

    def nvlinked(self, a: int, b: int) -> bool:
        return a == b or self.gpus[a].links[b].startswith("NV")

    def nvlink_domain(self) -> int:
        """The largest d dividing the GPU count such that each block of d consecutive GPUs is fully NVLinked.

        `nvidia-smi topo -mp` hides NVLinks, so it gives 1; so does a PCIe-only box.
        """
        n = len(self.gpus)
        for d in range(n, 0, -1):
            if n % d:
                continue
            if all(
                self.nvlinked(a, b)
                for start in range(0, n, d)
                for a in range(start, start + d)
                for b in range(start, start + d)
            ):
                return d
        return 1


def clean(text: str) -> str:
    """Remove terminal escape sequences and other control characters (tabs and newlines stay).

    Colour codes that lost their ESC (`[4mGPU0`, `Affinity[0m`, `[m`) go too, but only
    where they are clearly colour codes: at the start or end of a word, or inside a word
    between two pieces of the matrix (`PIX[0mNODE`). Elsewhere, such as `a[1mb` in prose,
    the text is left as it is.
    """
    text = _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    if "m" in text and "[" in text:
        text = _WORD.sub(_strip_orphan_sgr, text)
    return _CONTROL.sub("", text)


def _strip_orphan_sgr(word: re.Match[str]) -> str:
    text = word.group(0)
    if "[" not in text:
        return text
    pieces = _ORPHAN_SGR_RUN.split(text)  # the text around the codes: one more piece than codes
    codes = _ORPHAN_SGR_RUN.findall(text)
    out = [pieces[0]]
    for i, code in enumerate(codes):
        before, after = pieces[i], pieces[i + 1]
        at_edge = (i == 0 and not before) or (i == len(codes) - 1 and not after)
        between = bool(_MATRIX_WORD.fullmatch(before) and _MATRIX_WORD.fullmatch(after))
        out.append("" if at_edge or between else code)
        out.append(after)
    return "".join(out)


def _split_devices(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Header tokens -> (device names, the trailing column words)."""
    devices: list[str] = []
    for pos, token in enumerate(tokens):
        if token.startswith("CPU") or token == "NUMA" or (token == "GPU" and pos + 1 < len(tokens)):
            return devices, tokens[pos:]
        if _DEVICE_RUN.fullmatch(token):
            devices.extend(_DEVICE_ONE.findall(token))
        else:
            devices.append(token)
    return devices, []


def _tail_columns(words: list[str]) -> list[str]:
    columns: list[str] = []
    skip = False
    for pos, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word.startswith("CPU"):
            columns.append("cpu")
        elif word == "GPU" and pos + 1 < len(words) and words[pos + 1] == "NUMA":
            columns.append("gpu_numa")
            skip = True
        elif word == "NUMA":
            columns.append("numa")
    return columns


def _split_cells(tokens: list[str]) -> list[str]:
    out: list[str] = []
    for token in tokens:
        if _CELL_RUN.fullmatch(token) and not _CELL_ONE.fullmatch(token):
            out.extend(_CELL_ONE.findall(token))
        else:
            out.append(token)
    return out


def _is_header(tokens: list[str]) -> bool:
    if not tokens:
        return False
    first = _DEVICE_ONE.findall(tokens[0]) if _DEVICE_RUN.fullmatch(tokens[0]) else [tokens[0]]
    if first[0] != "GPU0":
        return False
    rest = first[1:] + tokens[1:]
    return not rest or not _CELL_RUN.fullmatch(rest[0])


def parse_topo(text: str, source: str = "nvidia-smi topo -m output", nic_names: list[str] | None = None) -> Topo:
    """Parse the matrix; ConfigError (naming `source`, the line and what was expected) on anything else.

    `nic_names` names the NIC0, NIC1.. columns when the NIC legend is missing
    (a paste cut short); it overrides the legend when both are given.
    """
    lines = clean(text).split("\n")
    warnings: list[str] = []

    def fail(path: str, value: object, allowed: str, line: int | None = None) -> ConfigError:
        return ConfigError(source, [Problem(path, value, allowed, line)])

    header_at = None
    for number, line in enumerate(lines, start=1):
        if _is_header(line.split()):
            header_at = number
            break
        match = _TRUNCATED.search(line)
        if match:
            warnings.append(
                f"{source}: nvidia-smi found {match.group(1)} NICs but printed only {match.group(2)};"
                " NICs left out of the matrix are not considered"
            )
    if header_at is None:
        if not text.strip():
            raise fail("", OMIT, f"is empty; {EXPECTED}")
        first = next((ln.strip() for ln in lines if ln.strip()), "")
        shown = first if len(first) <= 60 else first[:57] + "..."
        raise fail("", OMIT, f"no matrix header found (the first line reads {shown!r}); {EXPECTED}")

    devices, tail = _split_devices(lines[header_at - 1].split())
    columns = _tail_columns(tail)
    gpu_cols = [d for d in devices if _GPU.fullmatch(d)]
    nic_cols = [d for d in devices if not _GPU.fullmatch(d)]
    if gpu_cols != [f"GPU{i}" for i in range(len(gpu_cols))] or devices[: len(gpu_cols)] != gpu_cols:
        raise fail(
            "header", " ".join(devices), "expected the GPU columns first, numbered GPU0, GPU1, ... in order", header_at
        )
    ngpu, ndev = len(gpu_cols), len(devices)

    rows: dict[int, TopoGpu] = {}
    for number in range(header_at + 1, len(lines) + 1):
        tokens = lines[number - 1].split()
        if not tokens:
            continue
        label = tokens[0]
        match = _GPU.fullmatch(label)
        if not match:
            continue
        index = int(match.group(1))
        if index >= ngpu:
            raise fail(label, lines[number - 1].strip(), f"expected a row for one of GPU0..GPU{ngpu - 1} (the header's GPUs)", number)
        if index in rows:
            raise fail(label, label, "expected each GPU row once", number)
        cells = _split_cells(tokens[1:])
        if len(cells) < ndev:
            raise fail(
                label, len(cells), f"expected {ndev} cells, one per device in the header ({' '.join(devices)})", number
            )
        values = cells[ndev:]
        for pos, cell in enumerate(cells[:ndev]):
            column = devices[pos]
            if pos == index:
                if cell != "X":
                    raise fail(f"{label}.{column}", cell, "expected X where a GPU meets itself", number)
                continue
            if not _CELL_ONE.fullmatch(cell) or cell == "X":
                raise fail(
                    f"{label}.{column}",
                    cell,
                    "expected one of NV#, PIX, PXB, PHB, NODE, SYS (the path between two devices)",
                    number,
                )
        links = tuple(_ALIASES.get(c, c) for c in cells[:ngpu])
        nic_levels = tuple("PIX" if c.startswith("NV") else _ALIASES.get(c, c) for c in cells[ngpu:ndev])
        if len(values) > len(columns):
            extra = " ".join(values[len(columns):])
            raise fail(label, extra, f"unexpected text after the {ndev} device cells and the affinity columns", number)
        found = dict(zip(columns, values))
        rows[index] = TopoGpu(
            index=index,
            links=links,
            nic_levels=nic_levels,
            cpus=_cpus(found.get("cpu"), label, number, fail),
            numa=_numa(found.get("numa"), label, number, fail),
            line=number,
        )
    if not rows:
        raise fail("", OMIT, f"a header but no GPU rows; {EXPECTED}", header_at)
    missing = [i for i in range(ngpu) if i not in rows]
    if missing:
        raise fail(
            "",
            OMIT,
            f"the header lists GPU0..GPU{ngpu - 1} but there is no row for "
            + ", ".join(f"GPU{i}" for i in missing)
            + " (is the output cut off?)",
            header_at,
        )

    names = _nic_names(lines, nic_cols, nic_names, source, header_at, fail)
    if "cpu" not in columns and ngpu:
        warnings.append(f"{source}: no CPU Affinity column (an older driver?)")
    return Topo(
        source=source,
        gpus=tuple(rows[i] for i in range(ngpu)),
        nics=tuple(names),
        has_cpu_column="cpu" in columns,
        has_numa_column="numa" in columns,
        warnings=tuple(warnings),
    )


def _cpus(value: str | None, label: str, line: int, fail) -> frozenset[int] | None:  # type: ignore[no-untyped-def]
    if value is None or value.upper() == "N/A":
        return None
    try:
        return parse_cpulist(value)
    except ValueError as exc:
        raise fail(f"{label}.CPU Affinity", value, f"expected a CPU list such as 0-55,112-167 ({exc})", line) from None


def _numa(value: str | None, label: str, line: int, fail) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    if value is None or value.upper() == "N/A":
        return ()
    try:
        return tuple(sorted(parse_cpulist(value)))
    except ValueError:
        raise fail(f"{label}.NUMA Affinity", value, "expected a NUMA node number (or a list such as 6-7)", line) from None


def _nic_names(lines, nic_cols, given, source, header_at, fail) -> list[str]:  # type: ignore[no-untyped-def]
    if given is not None:
        if len(given) != len(nic_cols):
            raise fail(
                "--nic-names",
                ",".join(given),
                f"expected {len(nic_cols)} names, one per NIC column ({' '.join(nic_cols) or 'none'})",
            )
        names = list(given)
    else:
        legend: dict[str, str] = {}
        for line in lines[header_at:]:
            match = _LEGEND.match(line)
            if match:
                legend[match.group(1)] = match.group(2)
        names = []
        for column in nic_cols:
            if _NIC_PLACEHOLDER.fullmatch(column):
                if column not in legend:
                    raise fail(
                        "NIC Legend",
                        OMIT,
                        f"expected the NIC Legend that names {column} (lines such as `{column}: mlx5_0` after the"
                        " matrix); paste the whole output, or name the NIC columns with --nic-names mlx5_0,mlx5_1,...",
                    )
                names.append(legend[column])
            else:
                names.append(column)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise fail("NIC Legend", dupes, "expected each NIC device name once")
    return names
