"""YAML loading that remembers where each value came from.

Error messages point at the line of the offending field, so the loader keeps
a map from field path to line. `--set a.b=value` overrides go through the
same path syntax.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from clusterctl.errors import OMIT, ConfigError, Problem

FieldPath = tuple[str | int, ...]


def format_path(path: FieldPath) -> str:
    """`('parallel', 'tp')` -> `parallel.tp`; list indices as `[i]`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def parse_path(text: str) -> FieldPath:
    """Inverse of format_path: `gpus[0].nics` -> `('gpus', 0, 'nics')`."""
    parts: list[str | int] = []
    for chunk in text.replace("]", "").split("."):
        name, _, index = chunk.partition("[")
        if name:
            parts.append(name)
        if index.isdigit():
            parts.append(int(index))
    return tuple(parts)


class Located:
    """Parsed YAML data plus the line of every field path (1-based)."""

    def __init__(
        self, data: Any, lines: dict[FieldPath, int], source: str, overridden: frozenset[FieldPath] = frozenset()
    ) -> None:
        self.data = data
        self.lines = lines
        self.source = source
        self.overridden = overridden

    def is_overridden(self, path: FieldPath) -> bool:
        return any(path[: len(o)] == o for o in self.overridden)

    def line_of(self, path: FieldPath) -> int | None:
        """The line of the deepest known prefix of `path` (None when set on the command line)."""
        if self.is_overridden(path):
            return None
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return None

    def with_lines(self, problems: list[Problem]) -> list[Problem]:
        """Fill in each problem's line from its path."""
        return [self.locate(p) for p in problems]

    def locate(self, problem: Problem) -> Problem:
        """The problem with its line in the file, or marked as coming from --set."""
        path = parse_path(problem.path)
        if self.is_overridden(path):
            return Problem(problem.path, problem.value, problem.allowed, None, problem.note or "from --set")
        return Problem(problem.path, problem.value, problem.allowed, problem.line or self.line_of(path), problem.note)

    def with_overrides(self, overrides: list[str]) -> Located:
        """A copy with `--set FIELD=VALUE` overrides applied."""
        data = apply_overrides(self.data, overrides, self.source)
        paths = frozenset(parse_path(item.partition("=")[0].strip()) for item in overrides)
        return Located(data, self.lines, self.source, self.overridden | paths)


def parse_yaml(text: str, source: str) -> Located:
    """Parse one YAML document; malformed YAML and duplicate keys are ConfigErrors."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "malformed YAML"
        near = _line_text(text, line)
        message = f"malformed YAML: {what}" + (f" near `{near}`" if near else "")
        raise ConfigError(source, [Problem("", OMIT, message, line)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("", OMIT, f"malformed YAML: {exc}")]) from None
    finally:
        loader.dispose()
    lines: dict[FieldPath, int] = {}
    problems: list[Problem] = []
    if node is not None:
        _walk(node, (), lines, problems)
    if problems:
        raise ConfigError(source, problems)
    return Located(data, lines, source)


def load_yaml(path: Path, what: str) -> Located:
    """Read and parse a YAML file; a missing or unreadable file is a ConfigError."""
    source = f"{what} {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, [Problem("", OMIT, "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError(source, [Problem("", OMIT, "is a directory, expected a YAML file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [Problem("", OMIT, f"cannot be read as UTF-8 text ({exc})")]) from None
    return parse_yaml(text, source)


def _line_text(text: str, line: int | None) -> str:
    if line is None:
        return ""
    lines = text.splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _walk(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int], problems: list[Problem]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(
                    Problem(format_path(path + (key,)), OMIT, f"duplicate key (first given on line {seen[key]})", line)
                )
                continue
            seen[key] = line
            lines[path + (key,)] = line
            _walk(value_node, path + (key,), lines, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), lines, problems)


def apply_overrides(data: Any, overrides: list[str], source: str) -> Any:
    """Apply `a.b=value` overrides; the value is read as a YAML scalar or flow value.

    Creates intermediate mappings as needed, so any field can be set even when
    the file omits its section. Unknown fields are left for validation to
    reject with the list of valid keys.
    """
    result = copy.deepcopy(data) if data is not None else {}
    if not isinstance(result, dict):
        return result
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(source, [Problem("--set", item, "expected FIELD.PATH=VALUE, e.g. parallel.tp=8")])
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        target: Any = result
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            target = _descend(target, part, parts[: depth + 1], item, source)
        _assign(target, parts[-1], value, item, source)
    return result


def _descend(target: Any, part: str, walked: list[str], item: str, source: str) -> Any:
    if isinstance(target, list):
        index = _index(target, part, item, source)
        return target[index]
    if not isinstance(target, dict):
        raise ConfigError(source, [Problem("--set", item, f"'{'.'.join(walked[:-1])}' is not a mapping")])
    if target.get(part) is None:
        target[part] = {}
    return target[part]


def _assign(target: Any, part: str, value: Any, item: str, source: str) -> None:
    if isinstance(target, list):
        target[_index(target, part, item, source)] = value
    elif isinstance(target, dict):
        target[part] = value
    else:
        raise ConfigError(source, [Problem("--set", item, "the parent field is not a mapping or list")])


def _index(target: list[Any], part: str, item: str, source: str) -> int:
    if not part.isdigit() or int(part) >= len(target):
        raise ConfigError(source, [Problem("--set", item, f"a list index from 0 to {len(target) - 1}")])
    return int(part)
