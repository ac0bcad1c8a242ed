"""The node's processes: the aggregator (one per node per attempt) that batches its ranks' heartbeats to the
controller, and the warm process server (one per node per job) that forks ranks pre-imported.
"""
