"""Benchmarks: scripts that print JSON, never timed tests."""
