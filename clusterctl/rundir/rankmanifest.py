"""attempt-N/manifest.json: every rank's registration, one rank per line.

The file is one JSON document, so any JSON reader still reads it whole,
laid out so that a tool can also read it a rank at a time:

    {"attempt":1,"world_size":N,"hosts":[...],"groups":{...},"ranks":[
    {rank 0's registration, with "groups"},
    ...
    {rank N-1's}
    ]}

At 100,000 ranks the pure-Python encoder (any `indent`) took 12.5 s and
248 MB; here each rank's row is the compact JSON the rank itself stored,
copied without being decoded again. `read` and `iter_ranks` also read the
older indented layout, so attempts written before stay readable. This is
the one reader: every tool goes through it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from clusterctl.rundir import read_json

RANKS_OPEN = b'"ranks":['
END = b"]}"
CHUNK_ROWS = 4096  # rows joined per write: bounded memory, few system calls


def write(path: Path, header: dict[str, Any], rows: Iterable[bytes]) -> None:
    """Write the manifest atomically (temporary file, fsync, rename): readers see the old file or the new one.

    `rows` are compact JSON objects without newlines, in rank order.
    """
    head = json.dumps({k: v for k, v in header.items() if k != "ranks"}, separators=(",", ":")).encode()
    head = (head[:-1] + b"," if len(head) > 2 else b"{") + RANKS_OPEN + b"\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(head)
        batch: list[bytes] = []
        first = True
        for row in rows:
            batch.append(row)
            if len(batch) >= CHUNK_ROWS:
                fh.write((b"" if first else b",\n") + b",\n".join(batch))
                first, batch = False, []
        if batch:
            fh.write((b"" if first else b",\n") + b",\n".join(batch))
        fh.write(b"\n" + END + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read(path: Path) -> dict[str, Any] | None:
    """The whole manifest, or None while it is missing, being written, or not a JSON object."""
    return read_json(path)


def read_header(path: Path) -> dict[str, Any] | None:
    """Everything but the ranks (attempt, world size, hosts, groups) without reading the rows."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline()
    except OSError:
        return None
    if first.rstrip().endswith(RANKS_OPEN):
        try:
            data = json.loads(first.rstrip() + END)
        except ValueError:
            return None
        if isinstance(data, dict):
            data.pop("ranks", None)
            return data
        return None
    whole = read(path)  # the older, indented layout
    if whole is not None:
        whole.pop("ranks", None)
    return whole


def iter_ranks(path: Path) -> Iterator[dict[str, Any]]:
    """The rank records one at a time (memory for one row, not 100,000); nothing when unreadable."""
    try:
        fh = open(path, "rb")
    except OSError:
        return
    with fh:
        if not fh.readline().rstrip().endswith(RANKS_OPEN):
            whole = read(path)
            yield from [r for r in (whole or {}).get("ranks") or [] if isinstance(r, dict)]
            return
        for line in fh:
            line = line.rstrip()
            if line == END or not line:
                break
            try:
                row = json.loads(line[:-1] if line.endswith(b",") else line)
            except ValueError:
                return  # torn (being written): the reader stops where the file does
            if isinstance(row, dict):
                yield row
