"""Standalone benchmarks: ``python -m skrull_ext.bench <command>`` (the commands: __main__.py)."""
