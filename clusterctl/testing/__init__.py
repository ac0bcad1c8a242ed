"""Harnesses for tests and benchmarks: synthetic run directories, the checkpoint crash drill, a local gloo world."""
