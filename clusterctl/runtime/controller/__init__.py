"""The controller's process, one per attempt on the first node: the rendezvous store, admission of the
ranks that registered, the watchdog over their heartbeats, blame, and the attempt's one verdict.

`python -m clusterctl.runtime.controller` runs main.py (the batch script's name for it).
"""
