"""Aliases of clusterctl.runtime.node.warm for run directories rendered before the rooms."""
