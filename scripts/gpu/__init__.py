"""Runs on a lent GPU machine: its session script, checks and benchmarks."""
