"""Standalone benchmarks: ``python -m skrull_ext.bench {simulate,latency,adversarial,cp}``."""
