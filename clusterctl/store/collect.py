"""Reading many keys from torch's TCPStore in bounded requests.

One multi_get of every registration was quadratic: torch's libuv store
re-parses a partly received request from its start on every 4,000-byte
read (about 9e-9·N² s: 96 s at 100,000 keys), and it refuses a request of
more than 131,072 keys outright. Requests of CHUNK keys keep the whole
collection linear (0.13 s instead of 10.5 s at 32,768 keys here; at 65,536
~1.8 KB registrations, 256 keys a request took 0.25-0.4 s, 1,024 0.7 s and
4,096 2.2 s: the reply, not only the request, costs more than linearly).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

CHUNK = 256  # keys per request: ~6 KB asked, ~0.5 MB of registrations answered


def chunks(keys: Sequence[str], size: int = CHUNK) -> Iterator[Sequence[str]]:
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def fetch_all(store: Any, keys: Sequence[str], size: int = CHUNK) -> Iterator[bytes]:
    """Values of keys that all exist, in order (a missing key would wait for the store's timeout)."""
    for part in chunks(keys, size):
        yield from store.multi_get(list(part))


def iter_present(store: Any, keys: Sequence[str], size: int = CHUNK) -> Iterator[tuple[int, bytes]]:
    """(index, value) for the keys that exist now (some ranks never arrived), a chunk at a time.

    A chunk whose keys all exist costs one check and one multi_get; only a
    chunk with gaps is checked key by key. The caller decodes each chunk
    before the next is read, so undecoded values never pile up.
    """
    for start in range(0, len(keys), size):
        part = list(keys[start : start + size])
        if store.check(part):
            present = list(range(len(part)))
        else:
            present = [i for i, key in enumerate(part) if store.check([key])]
        if present:
            values = store.multi_get([part[i] for i in present])
            for i, value in zip(present, values):
                yield start + i, value


def count_present(store: Any, keys: Sequence[str], size: int = CHUNK) -> int:
    """How many of the keys exist now, without reading their values."""
    count = 0
    for part in chunks(keys, size):
        count += len(part) if store.check(list(part)) else sum(1 for key in part if store.check([key]))
    return count


def fetch_present(store: Any, keys: Sequence[str], size: int = CHUNK) -> dict[int, bytes]:
    """Index -> value for the keys that exist now."""
    return dict(iter_present(store, keys, size))
