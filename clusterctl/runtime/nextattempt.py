"""Alias of clusterctl.runtime.recovery.nextattempt for run directories rendered before the rooms (module doc of runtime)."""

from clusterctl.runtime import alias

alias(__name__, "clusterctl.runtime.recovery.nextattempt")
