"""The benchmarks: one tool, `python -m scripts.bench BENCHMARK` (__main__.py), one report (common.py)."""
