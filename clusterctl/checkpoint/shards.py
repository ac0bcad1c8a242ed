"""A DCP storage writer that checksums and fsyncs every file it writes.

The checksum is taken from the bytes on their way to the file (crc32, ~4 GiB/s
here, while the bytes are still in cache) so that no file is read back;
each file is fsynced before it is closed. The writer remembers, per file, its
size and checksum: the rank sends these to the coordinator, which puts them in
the manifest. DCP's own per-file fsync is switched off because this writer
does it (and announces it to the phase hook).
"""

from __future__ import annotations

import os
import threading
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generator

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from clusterctl.checkpoint import names, phases
from clusterctl.checkpoint.checksums import ShardDigest, format_checksum


class _ChecksummingStream:
    """A write-only file that checksums what passes through and fsyncs on close."""

    def __init__(self, path: Path, owner: "_ChecksummingFileSystem") -> None:
        self._fh = open(path, "wb")
        self._path = path
        self._owner = owner
        self._crc = 0
        self._size = 0
        self._is_metadata = path.name.startswith(names.DCP_METADATA)
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        phases.enter(phases.DCP_METADATA if self._is_metadata else phases.SHARD_WRITE, self._owner.step)
        self._crc = zlib.crc32(view, self._crc)
        self._fh.write(view)
        self._size += len(view)
        return len(view)

    def tell(self) -> int:
        return self._fh.tell()

    def fileno(self) -> int:
        return self._fh.fileno()

    def flush(self) -> None:
        self._fh.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if self.closed:
            return
        self._fh.flush()
        phases.enter(phases.DCP_METADATA if self._is_metadata else phases.SHARD_FSYNC, self._owner.step)
        os.fsync(self._fh.fileno())
        self._fh.close()
        self.closed = True
        self._owner.record(self._path.name, ShardDigest(self._path.name, self._size, format_checksum(self._crc)))

    def __enter__(self) -> "_ChecksummingStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _ChecksummingFileSystem(FileSystem):
    def __init__(self, step: int) -> None:
        self.step = step
        self._lock = threading.Lock()
        self.digests: dict[str, ShardDigest] = {}

    def record(self, name: str, digest: ShardDigest) -> None:
        with self._lock:
            self.digests[name] = digest

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[Any, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _ChecksummingStream(Path(path), self)
        try:
            yield stream
        finally:
            stream.close()

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        # DCP writes `.metadata.tmp` and renames it: the digest follows the name.
        super().rename(path, new_path)
        with self._lock:
            old = self.digests.pop(Path(path).name, None)
            if old is not None:
                new_name = Path(new_path).name
                self.digests[new_name] = ShardDigest(new_name, old.size, old.checksum)


class ChecksummingWriter(FileSystemWriter):
    """FileSystemWriter, one file per rank, whose files are checksummed and fsynced as written."""

    def __init__(self, path: Path, *, step: int, thread_count: int = 1) -> None:
        super().__init__(
            path, single_file_per_rank=True, sync_files=False, thread_count=thread_count, overwrite=False
        )
        self.fs = _ChecksummingFileSystem(step)

    @property
    def digests(self) -> list[ShardDigest]:
        """The files this rank wrote, in name order."""
        fs: _ChecksummingFileSystem = self.fs  # type: ignore[assignment]
        return [fs.digests[name] for name in sorted(fs.digests)]
