"""Utilities and checks: random weights, the conversion, the normalizer, word starts, fuzzing."""
