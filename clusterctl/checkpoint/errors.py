"""The one error a caller of the checkpoint API handles."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A save that did not commit (every rank raises the same one), or a bad argument."""
