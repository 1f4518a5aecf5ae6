"""Benchmarks of the scheduler: ``python -m skrull_ext.bench <command> --help``.

Commands live in one registry (``skrull_ext.bench.__main__.COMMANDS``) and
are imported only when run, so one command's dependencies never slow or
break another.
"""
