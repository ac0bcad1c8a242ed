"""What a shell would do with a command written as one string, and clusterctl does not.

A spec's `command: "python train.py --lr 1e-3"` is split into words the way a
shell splits them (shlex), and the words are the rank's argv: no shell ever
runs the string. So `&&`, `|`, `>`, `;`, `$VAR` and backticks would reach the
program as plain arguments (`python train.py && echo done` runs train.py
with the arguments `&&`, `echo`, `done`). `shell_feature` finds the first
such thing, outside single quotes (where a shell would not act on it either),
so the spec can refuse it and point at `[bash, -c, "..."]`.
"""

from __future__ import annotations

import json
import re
import shlex

OPERATORS = ("&&", "||", ">>", "|", ">", "<", ";", "&")
"""Control and redirection operators, longest first (`&&` before `&`)."""
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_EXPANDS_AFTER_DOLLAR = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_0123456789{(@*#?$!-")


def split_command(text: str) -> list[str]:
    """A command written as one string, as the rank's argv: split like a shell would; ValueError (the spec's
    message) when it cannot be split, is empty, or needs a shell to mean what it says."""
    try:
        parts = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"cannot split the command like a shell would: {exc}") from None
    if not parts:
        raise ValueError("expected a non-empty command")
    feature = shell_feature(text)
    if feature is not None:
        unexpanded = " unexpanded" if feature[0] in "$`" else ""
        what, instead = f"`{feature}` would reach the program{unexpanded} as an argument", ""
    elif _ASSIGNMENT.match(parts[0]):
        what, instead = f"`{parts[0]}` would be run as the program", " (or set the variable in env:)"
    else:
        return parts
    raise ValueError(
        f"a command given as one string is split into words, but no shell runs it: {what}; write the command"
        f" as a list, or run a shell yourself: [bash, -c, {json.dumps(text)}]{instead}")


def shell_feature(text: str) -> str | None:
    """The first shell operator or expansion in `text` that a shell would act on (`&&`, `$HOME`, a backtick), or None.

    Backslash escapes and quotes are honoured as a POSIX shell honours them:
    nothing inside single quotes counts, inside double quotes only `$` and
    backticks do (a shell expands them there too).
    """
    i, quote = 0, ""
    while i < len(text):
        ch = text[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif ch == "\\":
            i += 1  # the next character is literal (inside double quotes too, for $ ` " \)
        elif ch == "`":
            return "`"
        elif ch == "$" and i + 1 < len(text) and text[i + 1] in _EXPANDS_AFTER_DOLLAR:
            return _expansion(text, i)
        elif quote == '"':
            quote = "" if ch == '"' else quote
        elif ch in "'\"":
            quote = ch
        else:
            for op in OPERATORS:
                if text.startswith(op, i):
                    return op
        i += 1
    return None


def _expansion(text: str, at: int) -> str:
    """`$NAME`, `${...}`, `$(...)` or `$1` as written, for the message."""
    nxt = text[at + 1]
    if nxt in "{(":
        close = text.find("}" if nxt == "{" else ")", at)
        return text[at:close + 1] if close > 0 else text[at:at + 2]
    end = at + 2
    if nxt.isalpha() or nxt == "_":
        while end < len(text) and (text[end].isalnum() or text[end] == "_"):
            end += 1
    return text[at:end]
