"""Benchmarks: `make bench` (frontend/platform) and `make bench-router` (routing)."""
