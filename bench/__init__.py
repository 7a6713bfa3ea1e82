"""Benchmarks for omni. Run ``python -m bench --help``."""
