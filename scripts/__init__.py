"""What is run by hand: the benchmark tool (bench/), the server harness the benchmarks and tests share
(harness.py), checks and one-off investigations (tools/), the images' checks (images/), the GPU machine's
steps (gpu/). Every module runs as `python -m scripts....` from the repository's root (docs/testing.md)."""
