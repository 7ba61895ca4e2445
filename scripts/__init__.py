"""Benchmarks, GPU runs and checks; each script is run as a file (docs/testing.md, "Scripts")."""
