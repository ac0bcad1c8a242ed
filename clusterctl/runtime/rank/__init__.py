"""The rank's process: the launcher that runs the user's script, its rendezvous, heartbeats and step reports,
and the checks it makes before and after the rendezvous.
"""
