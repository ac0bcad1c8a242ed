"""Alias of clusterctl.integrations.rank.framework: where users' scripts import it (docs/design.md)."""

from clusterctl.runtime import alias

alias(__name__, "clusterctl.integrations.rank.framework")
