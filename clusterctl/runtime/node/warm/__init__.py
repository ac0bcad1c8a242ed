"""Warm processes: a pre-imported process server per node, from which each attempt's ranks are forked.

server.py runs once per node for the whole job (spares too); client.py is
what a rank's (or the controller's) process becomes when it asks its node's
server for a child; child.py is what the forked child does before it runs
the command; protocol.py is the one definition of what they say. Standard
library only, except what the server pre-imports.
"""
