"""Benchmarks and GPU step scripts (repository only, not installed)."""
