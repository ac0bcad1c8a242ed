"""Alias of clusterctl.runtime.node.warm.server for run directories rendered before the rooms."""

from clusterctl.runtime import alias

alias(__name__, "clusterctl.runtime.node.warm.server")
