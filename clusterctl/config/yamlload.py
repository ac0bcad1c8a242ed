"""YAML loading that remembers where each value came from.

Error messages point at the line of the offending field, so the loader keeps
a map from field path to line. `--set a.b=value` overrides go through the
same path syntax.
"""

from __future__ import annotations

import copy
import re
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
    """Inverse of format_path: `gpus[0].nics` or `gpus.0.nics` -> `('gpus', 0, 'nics')`."""
    parts: list[str | int] = []
    for chunk in text.replace("]", "").split("."):
        name, _, index = chunk.partition("[")
        if name:
            parts.append(int(name) if name.isdigit() else name)
        if index.isdigit():
            parts.append(int(index))
    return tuple(parts)


class Located:
    """Parsed YAML data plus the line of every field path (1-based)."""

    def __init__(
        self,
        data: Any,
        lines: dict[FieldPath, int],
        source: str,
        overridden: frozenset[FieldPath] = frozenset(),
        raw: dict[FieldPath, str] | None = None,
    ) -> None:
        self.data = data
        self.lines = lines
        self.source = source
        self.overridden = overridden
        self.raw = raw or {}
        """Unquoted scalars that YAML turned into numbers or booleans, as written (`010`, `0x1F`, `yes`)."""

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
        raw = dict(self.raw)
        for item in overrides:
            key, _, value = item.partition("=")
            raw[parse_path(key.strip())] = value.strip()
        paths = frozenset(parse_path(item.partition("=")[0].strip()) for item in overrides)
        return Located(data, self.lines, self.source, self.overridden | paths, raw)

    def as_written(self, prefixes: tuple[str, ...]) -> Any:
        """The data with scalars under `prefixes` restored to their text as written.

        Environment values and argv items are text: `A: 010` means "010", not
        the 8 that YAML 1.1 reads.
        """
        data = copy.deepcopy(self.data)
        for path, text in self.raw.items():
            if len(path) == 2 and path[0] in prefixes:
                _set_if_scalar(data, path, text)
        return data


MAX_DEPTH = 64
"""Nesting deeper than any spec or site needs; deeper documents are refused before they exhaust the stack."""

# What YAML allows in a stream (PyYAML's reader refuses everything else).
_NOT_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")
_CHAR_NAMES = {0x00: "NUL", 0x1B: "ESC", 0x7F: "DEL", 0x08: "backspace", 0x0C: "form feed", 0x0B: "vertical tab"}


class _DepthLimitedLoader(yaml.SafeLoader):
    """SafeLoader whose (recursive) composer refuses nesting deeper than MAX_DEPTH."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _TooDeep(mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _TooDeep(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


def _unprintable_problem(text: str) -> Problem | None:
    """The first character YAML cannot carry, with its line and column, as a Problem."""
    found = _NOT_PRINTABLE.search(text)
    if found is None:
        return None
    code = ord(found.group())
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    name = f"U+{code:04X}" + (f" ({_CHAR_NAMES[code]})" if code in _CHAR_NAMES else "")
    more = len(_NOT_PRINTABLE.findall(text)) - 1
    others = f"; {more} more such character{'s' if more != 1 else ''} follow" if more else ""
    hint = " (a terminal colour code pasted with the text?)" if code == 0x1B else ""
    return Problem(
        "",
        OMIT,
        f"column {column}: control character {name} is not allowed in YAML, not even in a comment{hint};"
        f" remove it{others}",
        line,
    )


def _malformed(exc: yaml.MarkedYAMLError, text: str) -> Problem:
    """Where the YAML broke. An unclosed `[` or `{` is only noticed on a later line (the next key): the line named
    is the bracket's own, and the later one is said too."""
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark else None
    what = exc.problem or exc.context or "malformed YAML"
    near = _line_text(text, line)
    opened = exc.context_mark
    if (exc.context or "").startswith("while parsing a flow") and opened is not None and line != opened.line + 1:
        bracket = text[opened.index] if opened.index < len(text) else "bracket"
        later = f" (line {line}: {what}" + (f" near `{near}`" if near else "") + ")"
        return Problem("", OMIT, f"malformed YAML: the `{bracket}` on this line is never closed{later}", opened.line + 1)
    return Problem("", OMIT, f"malformed YAML: {what}" + (f" near `{near}`" if near else ""), line)


def parse_yaml(text: str, source: str) -> Located:
    """Parse one YAML document; malformed YAML and duplicate keys are ConfigErrors."""
    unprintable = _unprintable_problem(text)
    if unprintable is not None:
        raise ConfigError(source, [unprintable])
    try:
        loader = _DepthLimitedLoader(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("", OMIT, f"malformed YAML: {exc}")]) from None
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(source, [_malformed(exc, text)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("", OMIT, f"malformed YAML: {exc}")]) from None
    except _TooDeep as exc:
        raise ConfigError(
            source, [Problem("", OMIT, f"nested more than {MAX_DEPTH} levels deep; a spec or site needs a few", exc.line)]
        ) from None
    finally:
        loader.dispose()
    lines: dict[FieldPath, int] = {}
    raw: dict[FieldPath, str] = {}
    problems: list[Problem] = []
    if node is not None:
        _check_aliases(node, source)
        _walk(node, (), lines, raw, problems, set())
    if problems:
        raise ConfigError(source, problems)
    return Located(data, lines, source, raw=raw)


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


def _set_if_scalar(data: Any, path: FieldPath, text: str) -> None:
    target = data
    for part in path[:-1]:
        try:
            target = target[part]
        except (KeyError, IndexError, TypeError):
            return
    try:
        current = target[path[-1]]
    except (KeyError, IndexError, TypeError):
        return
    if isinstance(current, (int, float, bool)):
        target[path[-1]] = text


def _line_text(text: str, line: int | None) -> str:
    if line is None:
        return ""
    lines = text.splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


MAX_EXPANDED_NODES = 100_000


def _check_aliases(root: yaml.Node, source: str) -> None:
    """Reject recursive aliases and alias bombs before anything walks the expanded tree."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ConfigError(
                source, [Problem("", OMIT, "a YAML alias refers to a node that contains it", node.start_mark.line + 1)]
            )
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        active.discard(key)
        sizes[key] = min(total, MAX_EXPANDED_NODES + 1)
        return sizes[key]

    if size(root) > MAX_EXPANDED_NODES:
        raise ConfigError(
            source, [Problem("", OMIT, f"the document expands to more than {MAX_EXPANDED_NODES} values through aliases")]
        )


_PLAIN_NON_TEXT = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")


def _walk(
    node: yaml.Node,
    path: FieldPath,
    lines: dict[FieldPath, int],
    raw: dict[FieldPath, str],
    problems: list[Problem],
    seen_nodes: set[int],
) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.ScalarNode):
        if node.style is None and node.tag in _PLAIN_NON_TEXT:
            raw[path] = node.value
        return
    if id(node) in seen_nodes:
        return  # an alias of a node already walked: its lines are known
    seen_nodes.add(id(node))
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
            _walk(value_node, path + (key,), lines, raw, problems, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), lines, raw, problems, seen_nodes)


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
            value = yaml.load(raw, Loader=_DepthLimitedLoader) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        except _TooDeep:
            raise ConfigError(source, [Problem("--set", item, f"a value nested at most {MAX_DEPTH} levels deep")]) from None
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
        parent = ".".join(walked[:-1]) or "(top level)"
        raise ConfigError(source, [Problem("--set", item, f"'{parent}' holds {type(target).__name__}, not fields")])
    if target.get(part) is None:
        target[part] = {}
    return target[part]


def _assign(target: Any, part: str, value: Any, item: str, source: str) -> None:
    if isinstance(target, list):
        target[_index(target, part, item, source)] = value
    elif isinstance(target, dict):
        target[part] = value
    else:
        parent = item.partition("=")[0].rpartition(".")[0] or "(top level)"
        raise ConfigError(source, [Problem("--set", item, f"'{parent}' holds {type(target).__name__}, not fields")])


def _index(target: list[Any], part: str, item: str, source: str) -> int:
    if not part.isdigit() or int(part) >= len(target):
        raise ConfigError(source, [Problem("--set", item, f"a list index from 0 to {len(target) - 1}")])
    return int(part)
