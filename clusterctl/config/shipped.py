"""Where the shipped templates and site configs live.

They sit at the top of the source tree (`templates/`, `site-configs/`) for
admins to read and copy, and are packaged as `clusterctl/templates` and
`clusterctl/site_configs` so a non-editable install finds them too.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # clusterctl/
_SOURCE_ROOT = _PACKAGE.parent
_DIRS = {"templates": "templates", "site_configs": "site-configs"}


def shipped_dir(kind: str) -> Path:
    """The directory of shipped `templates` or `site_configs`."""
    source = _SOURCE_ROOT / _DIRS[kind]
    if (_SOURCE_ROOT / "pyproject.toml").is_file() and source.is_dir():
        return source
    return _PACKAGE / kind
