"""Alias of clusterctl.integrations.rank.hf: where users' scripts import it (docs/design.md)."""

from clusterctl.runtime import alias

alias(__name__, "clusterctl.integrations.rank.hf")
