"""Development environment: CPU/GPU import shims and offline wheel builders (repository only, never in the wheel)."""
