"""Errors a user can act on, each carrying its exit code.

A `ConfigError` lists every problem found in a spec or site so the user can
fix them in one go; each problem names the field path, the bad value and
what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusterctl.exitcodes import ExitCode


class ClusterctlError(Exception):
    """An error with a message meant for the user and a documented exit code."""

    exit_code: ExitCode = ExitCode.BUG

    def __init__(self, message: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where, what was given, what is allowed."""

    path: str
    value: Any
    allowed: str
    line: int | None = None
    note: str = ""

    def render(self) -> str:
        where = self.path
        if self.line is not None:
            where = f"{where} (line {self.line})" if where else f"line {self.line}"
        text = self.allowed if self.value is OMIT else f"got {_show(self.value)}; {self.allowed}"
        if where:
            text = f"{where}: {text}"
        if self.note:
            text += f" ({self.note})"
        return text


_MISSING = object()
OMIT = object()
"""A Problem value for rules about several fields, where no one value is wrong."""


def _show(value: Any) -> str:
    if value is _MISSING:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


MISSING = _MISSING


class ConfigError(ClusterctlError):
    """A bad job spec or site config (exit 65); nothing was submitted."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__(self._text(), ExitCode.BAD_CONFIG)

    def _text(self) -> str:
        head = f"invalid {self.source}"
        if len(self.problems) == 1:
            return f"{head}: {self.problems[0].render()}"
        lines = [f"{head}: {len(self.problems)} problems"]
        lines += [f"  - {p.render()}" for p in self.problems]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._text()
