"""Slurm releases as people and programs write them, and the options each release brought.

`scontrol --version` prints `slurm 24.05.3`, Debian's build `slurm-wlm 22.05.8`,
pyslurm `22.5.3`, a site config `"24.05"`: all are the release (24, 5). The
sbatch and srun options a rendered script may carry depend on it, so the
releases that introduced them are written down here, once.
"""

from __future__ import annotations

import re

Release = tuple[int, int]

_RELEASE = re.compile(r"(\d+)\.(\d+)")
_SITE_FORM = re.compile(r"^(\d{2})\.(\d{1,2})(?:\.\d+)?$")

SEGMENT: Release = (24, 5)
"""`--segment=N` and `--exclusive=topo` (topology/block)."""
TASK_SHARING: Release = (23, 11)
"""`srun --gres-flags=allow-task-sharing`: a node's ranks keep peer access to each other's GPUs."""
BLOCK_PLUGIN: Release = (23, 11)
"""topology/block itself."""


def major_minor(text: str) -> Release | None:
    """The release in any text that holds one: '22.5.3' and 'slurm-wlm 22.05.8' are both (22, 5)."""
    found = _RELEASE.search(text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def parse_site_release(value: object) -> str:
    """A site config's `slurm_version`, checked: a quoted 'YY.MM' (or 'YY.MM.P'); ValueError naming the form."""
    if not isinstance(value, str):
        raise ValueError('expected a quoted release such as "24.05" (unquoted, YAML reads 24.10 as the number 24.1)')
    text = value.strip()
    found = _SITE_FORM.match(text)
    if not found or not 1 <= int(found.group(2)) <= 12:
        raise ValueError('expected a Slurm release such as "24.05" or "24.05.3" (what `scontrol --version` prints)')
    return text


def release_name(release: Release) -> str:
    """(24, 5) as "24.05"."""
    return f"{release[0]}.{release[1]:02d}"
