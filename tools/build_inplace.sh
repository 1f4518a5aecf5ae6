#!/usr/bin/env bash
# Developer helper: build skrull_ext._core and drop it next to the sources, so
# `PYTHONPATH=$PWD python ...` runs this checkout without installing it
# (several git worktrees can then share one virtual environment).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --no-build-isolation needs the build backend in this environment; an environment made by
# the README's `pip install -e .` (isolated build) does not have it.
"$py" -c "import scikit_build_core, pybind11" 2>/dev/null \
  || "$py" -m pip install -q "scikit-build-core>=0.11" "pybind11>=3.0" 2>&1 | grep -v '^WARNING: Location' || true
"$py" -m pip install -q --no-build-isolation --no-deps --target "$tmp" . 2>&1 | grep -v '^WARNING: Location' || true
cp "$tmp"/skrull_ext/_core*.so skrull_ext/
echo "built $(ls skrull_ext/_core*.so)"
