"""Durations and counts as people write them in job specs.

Durations accept Slurm's own formats (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
`D-HH:MM`, `D-HH:MM:SS`) and suffixed ones (`90s`, `15m`, `4h`, `2d`), so a
spec can say `time_limit: 4h` or copy `--time=1-00:00:00` from a script.
"""

from __future__ import annotations

import math
import re

_SUFFIX = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SUFFIXED = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_SLURM = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration(value: object, *, bare_unit: int = 1) -> int:
    """Seconds from an int (in `bare_unit` seconds) or a duration string.

    `bare_unit` is 60 for fields that follow Slurm, where a bare number means
    minutes, and 1 elsewhere.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 15m, 4h or 1-00:00:00")
    if isinstance(value, (int, float)):
        seconds = value * bare_unit
    elif isinstance(value, str):
        seconds = _parse_text(value.strip(), bare_unit)
    else:
        raise ValueError("expected a duration such as 90s, 15m, 4h or 1-00:00:00")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("expected a positive duration")
    return int(math.ceil(seconds))


def _parse_text(text: str, bare_unit: int) -> float:
    match = _SUFFIXED.match(text)
    if match:
        return float(match.group(1)) * _SUFFIX[match.group(2)]
    match = _SLURM.match(text)
    if not match:
        raise ValueError("expected a duration such as 90s, 15m, 4h or 1-00:00:00")
    days, first, second, third = match.groups()
    if days is not None:
        # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if third is not None:  # HH:MM:SS
        return int(first) * 3600 + int(second) * 60 + int(third)
    if second is not None:  # MM:SS
        return int(first) * 60 + int(second)
    return int(first) * bare_unit  # bare number


def format_slurm_time(seconds: int) -> str:
    """`D-HH:MM:SS` as sbatch's --time takes it (rounded up to whole seconds)."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def format_duration(seconds: float) -> str:
    """Short human form: `45s`, `12m30s`, `3h05m`, `2d04h`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"


_COUNT = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMbBtT]?)$")
_COUNT_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_count(value: object) -> int:
    """A parameter count: `7000000000`, `7e9`, `7B`, `350M`, `1.5T`."""
    if isinstance(value, bool):
        raise ValueError("expected a count such as 7B, 350M or 7000000000")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _COUNT.match(value.strip())
        if match:
            number = float(match.group(1)) * _COUNT_SCALE[match.group(2).lower()]
        else:
            try:
                number = float(value)
            except ValueError:
                raise ValueError("expected a count such as 7B, 350M or 7000000000") from None
    else:
        raise ValueError("expected a count such as 7B, 350M or 7000000000")
    if not math.isfinite(number) or number < 1:
        raise ValueError("expected a positive count")
    return int(round(number))


def format_gb(n: float) -> str:
    """Bytes in GB (10^9), the unit GPU memory is sold in: `35.62 GB`."""
    if abs(n) >= 1e8:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB"


def format_figure(value: object, spec: str = ".4g") -> str:
    """A figure as people read it, on the terminal and in the report page alike: 25,320 rather than 2.532e+04;
    "-" when unknown."""
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) >= 1000:
        return f"{value:,.0f}"
    if isinstance(value, float):
        return format(value, spec)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10000:
        return f"{value:,}"
    return str(value)
