"""Every option of every ``python -m skrull_ext.bench`` subcommand has help text
that shows its default, and no user-facing help points at internal issues."""

import argparse
import importlib

import pytest

from skrull_ext.bench.__main__ import COMMANDS


class _Stop(Exception):
    pass


OTHER_CLIS = {  # the other user-facing argparse commands
    "skrull_ext.profile.check": "skrull_ext.profile.check:main",
    "skrull_ext.export": "skrull_ext.export:main",
    "skrull_ext.prepare": "skrull_ext.prepare:main",
}


@pytest.mark.parametrize("name", sorted(COMMANDS) + sorted(OTHER_CLIS))
def test_options_have_help_and_defaults(name, monkeypatch):
    parsers = []

    def grab(self, args=None, namespace=None):
        parsers.append(self)
        raise _Stop

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", grab)
    spec = OTHER_CLIS.get(name) or (COMMANDS[name][0] if isinstance(COMMANDS[name], tuple) else COMMANDS[name])
    module, fn = spec.split(":")
    with pytest.raises(_Stop):
        getattr(importlib.import_module(module), fn)([])
    (parser,) = parsers
    shows_defaults = parser.formatter_class is argparse.ArgumentDefaultsHelpFormatter
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{name} {action.option_strings}: no help"
        has_default = action.default not in (None, False, argparse.SUPPRESS) and not action.required
        assert not has_default or shows_defaults or "default" in action.help, f"{name} {action.option_strings}"
        assert "issue" not in action.help.lower()
    assert "issue" not in (parser.description or "").lower()


@pytest.mark.slow
def test_the_moved_prepare_command_says_where_it_went():
    """``python -m skrull_ext.data prepare`` (the command before it moved to the package
    root) ends in one error line naming the new command with the same arguments, rc 2."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "skrull_ext.data", "prepare", "job.toml", "--workers", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: the store is built by 'python -m skrull_ext.prepare job.toml --workers 2' "
        "(python -m skrull_ext.data prepare moved there)"]
