# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""``python -m skrull_ext.profile``: see cli.py."""

from torchtitan_patches import compat

compat.install_import_shims()  # before torchtitan is imported (torch 2.11-2.12)

from skrull_ext.cli_errors import run_cli  # noqa: E402
from skrull_ext.profile.cli import main  # noqa: E402


def cli() -> None:
    """The console script: a user error as one line, exit 2 (as ``python -m``)."""
    run_cli(main)


if __name__ == "__main__":
    cli()
