#!/usr/bin/env bash
# Developer helper: a virtual environment for a second git worktree that reuses
# the main checkout's installed packages (torch, torchtitan, ...) but imports
# skrull_ext and torchtitan_patches from this worktree.
#
#   git worktree add ../wt-x -b x && cd ../wt-x && bash tools/worktree_venv.sh /path/to/main/.venv
#   . .venv/bin/activate
#
# PYTHONPATH alone is not enough: the main environment's editable install puts
# an import finder ahead of sys.path, so it would keep importing the main
# checkout. Here the main site-packages is added as a plain path (its .pth
# files, the editable finder among them, are not run) and this worktree first.
# The core is built next to the sources (tools/build_inplace.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
main_venv=$(cd "${1:?usage: tools/worktree_venv.sh MAIN_VENV}" && pwd)
site=$("$main_venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 -m venv .venv
own=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
printf '%s\n' "$PWD" > "$own/00_worktree.pth"
printf '%s\n' "$site" > "$own/main_venv.pth"
# torchrun must run this environment's python, not the main one's.
printf '#!%s\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n' "$PWD/.venv/bin/python" > .venv/bin/torchrun
chmod +x .venv/bin/torchrun
PYTHON=.venv/bin/python bash tools/build_inplace.sh
.venv/bin/python -c "import skrull_ext, torchtitan_patches; print('skrull_ext from', skrull_ext.__file__)"
