"""Errors whose message is all a user needs: the launchers print them as one
line (``skrull_ext.cli_errors``), without a traceback."""


class UserError(ValueError):
    """Bad input a user can fix: a job file, a flag, a data file. The message
    names the key (or file:line), the value and what is allowed."""


class JobFileError(UserError):
    """A job file (or a value in it, or a flag) is invalid; the message names the key."""


class DataError(UserError):
    """A data file cannot be read; the message names the file and line."""


class NothingToTrain(Exception):
    """The run's checkpoint is already at (or past) ``training.steps``: nothing is left to
    train. Not a mistake: the launchers print the message as one line and exit 0."""
