"""Small helpers the preflight checks share: skipped results, one-line details, file and errno handling.

Kept apart so each check module holds only its check; standard library only,
like the rest of the package.
"""

from __future__ import annotations

import errno
import os

from clusterctl.runtime.rank.preflight.context import CheckResult


def _skip(name: str, detail: str) -> CheckResult:
    return CheckResult(name, ok=True, skipped=True, detail=detail, data={})


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _errno_text(code: int) -> str:
    return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"


def _os_error(exc: OSError) -> str:
    return _errno_text(exc.errno) if exc.errno else str(exc)


def _one_line(text: str) -> str:
    return " ".join(text.split())
