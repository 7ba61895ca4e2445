"""Utilities, checks and one-off investigations, apart from the benchmark tool: random weights, the
conversion, precision, the normalizer, word starts, fuzzing, GPU profiles and checks, graph buckets."""
