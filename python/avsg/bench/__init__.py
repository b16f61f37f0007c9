"""Benchmarks: each compares against its baselines in the same run and prints ratios."""
