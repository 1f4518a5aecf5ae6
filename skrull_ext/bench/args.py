"""Argument types the bench commands share: a bad value is argparse's one usage line, exit 2.

Each is ``cli_errors.argument_type``: its ValueError becomes argparse's message as given
(``argument --profile: ...``); argparse's own reads "invalid <name> value", and a value checked
only after parsing (a profile read when the run starts) was a traceback.
"""

from __future__ import annotations

from skrull_ext.cli_errors import argument_type


def _loaded_profile(text: str) -> str:
    """``--profile FILE``: a profile TOML that loads (read once here to check it, before any
    work; ``Profile.load`` names a missing file, bad TOML or a bad field)."""
    from skrull_ext.scheduler.profile_file import Profile

    Profile.load(text)
    return text


profile_path = argument_type(_loaded_profile, "profile")


def at_least(lo: int):
    """An integer type for argparse that refuses values below ``lo``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise ValueError(f"must be >= {lo}, got {value}")
        return value

    return argument_type(parse, f"integer >= {lo}")
