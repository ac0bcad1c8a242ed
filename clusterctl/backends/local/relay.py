"""Task output relayed line by line, as srun does: whole lines only, optionally labelled.

Each task's stdout and stderr arrive on pipes; a Stream buffers a task's
partial line and writes complete lines, each prefixed by the task's label
(`N: `) under --label, to a Sink: an output file or srun's own stdout/stderr.
One writer per file and whole lines per write, so lines of different tasks
never mix. At the end of a stream, a last line without a newline gets one
when labelled (as Slurm's write_labelled_message does) and is written as it
is otherwise.
"""

from __future__ import annotations

import os
import time

MAX_LINE = 1 << 16  # a longer line without a newline is relayed in pieces


class Sink:
    """Where relayed output goes: an open file or srun's own stdout/stderr."""

    def __init__(self, fd: int, owned: bool) -> None:
        self.fd = fd
        self.owned = owned
        self.broken = False

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.broken:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                self.broken = True  # a closed reader must not stop the step


class Stream:
    """One pipe from a task (its stdout, stderr, or both), relayed line by line."""

    def __init__(self, fd: int, sink: Sink, prefix: bytes) -> None:
        self.fd = fd
        self.sink = sink
        self.prefix = prefix
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        if b"\n" in data:
            head, _, self.buf = self.buf.rpartition(b"\n")
            self.emit(head.split(b"\n"), complete=True)
        while len(self.buf) >= MAX_LINE:
            piece, self.buf = self.buf[:MAX_LINE], self.buf[MAX_LINE:]
            self.emit([piece], complete=False)

    def emit(self, lines: list[bytes], complete: bool) -> None:
        if self.prefix:
            self.sink.write(b"".join(self.prefix + line + b"\n" for line in lines))
        else:
            self.sink.write(b"\n".join(lines) + (b"\n" if complete else b""))

    def close(self) -> None:
        """End of the stream: a last line without a newline gets one when labelled, as in Slurm."""
        if self.buf:
            self.emit([self.buf], complete=bool(self.prefix))
            self.buf = b""
