"""Benchmarks: the engines, the server under load, the front end; JSON out."""
