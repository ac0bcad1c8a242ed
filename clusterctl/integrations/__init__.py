"""Bridges that let other Python tools submit clusterctl runs (the submitit executor)."""
