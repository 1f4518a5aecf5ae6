# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""``python -m skrull_ext.profile``: see cli.py."""

import sys

from skrull_ext.profile.cli import main

if __name__ == "__main__":
    sys.exit(main())
