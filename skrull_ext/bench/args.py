"""Argument types the bench commands share: a bad value is argparse's one usage line, exit 2.

argparse prints an ``ArgumentTypeError``'s message as given (``argument --profile: ...``);
any other exception from a type function reads "invalid <name> value", and one raised after
parsing (a profile read when the run starts) was a traceback.
"""

from __future__ import annotations

import argparse


def profile_path(text: str) -> str:
    """``--profile FILE``: a profile TOML that loads (read once here to check it, before any
    work; ``Profile.load`` names a missing file, bad TOML or a bad field)."""
    from skrull_ext.scheduler.profile_file import Profile

    try:
        Profile.load(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def at_least(lo: int):
    """An integer type for argparse that refuses values below ``lo``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value

    parse.__name__ = f"integer >= {lo}"
    return parse
