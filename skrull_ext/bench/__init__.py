"""Standalone benchmarks: ``python -m skrull_ext.bench {latency,simulate}``."""
