"""Profiling helpers for one-off GPU investigations (repository only)."""
