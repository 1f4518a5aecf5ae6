#!/usr/bin/env bash
# The compat lane in one command: another torch than CI's 2.13 on CPU, by
# default the GPU image's 2.11. torchtitan 0.3.0 was written against torch
# 2.13-2.14; torchtitan_patches/compat.py shims what other torches lack or
# changed, and only a run on that torch shows the shims still cover every path.
# Run it after changing compat.py, the entry points, or anything torchtitan
# imports, on the oldest and the newest torch the project promises.
#
#   bash tools/compat_lane.sh                                  # torch 2.11.0
#   TORCH_VERSION=2.15.0 TRITON_VERSION=3.9.0 bash tools/compat_lane.sh
#
# TRITON_VERSION: the triton that torch's wheel requires (its METADATA's
# `triton~=X.Y`: 2.11 3.6, 2.14 3.8, 2.15 3.9); 3.6.0 by default, for 2.11.0.
# 1. venv: .venv-torch$TORCH_VERSION (git-ignored), built when absent or on
#    another torch: torch==$TORCH_VERSION and triton==$TRITON_VERSION FIRST
#    (the registry's CUDA build, ~3 GB; it runs on CPU), then
#    `pip install -e ".[train,bench,test]"` under a constraint that keeps that
#    torch, passed as PIP_CONSTRAINT so it replaces a machine-wide pip
#    constraint (one capping torch below the version asked for would refuse
#    it). Reused as it is when its torch is right and it imports this
#    checkout with the .pth hook installed (REINSTALL=1: run the project
#    install again, e.g. after a C++ change).
#    VENV=/path uses that venv instead, built there when absent; one that
#    exists on another torch, or installed from another checkout, is refused,
#    never changed. A venv whose C++ core is older than cpp/, CMakeLists.txt
#    or pyproject.toml gets the core rebuilt (pip install --no-deps -e .).
# 2. stages, each with its rc and wall seconds on one summary line:
#    quick     python -m pytest -m "not slow" -q -p no:cacheprovider
#    skrull    the README's main job: torchrun, 2 ranks, debug_cpu.toml, CP 2
#    packed    the same job with --skrull.no-enable (torchtitan's batching)
#    titan     python -m torchtitan.train --module skrull_ext.train --config
#              llama3_debugmodel_cpu --training.steps 2 (torchtitan imports
#              itself first: the .pth hook's path)
# Exits non-zero if torch.__version__ is not $TORCH_VERSION or any stage fails.
# CUDA_VISIBLE_DEVICES is emptied: a CPU lane on any machine.
# Logs (and the jobs' dump folders) go to LOG_DIR (default a fresh temp folder).
# PYTHON: the interpreter that builds a venv (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
TRITON_VERSION=${TRITON_VERSION:-3.6.0}
own_venv=0
if [ -z "${VENV:-}" ]; then VENV=$root/.venv-torch$TORCH_VERSION; own_venv=1; fi
py=$VENV/bin/python
logs=${LOG_DIR:-$(mktemp -d -t compat_lane.XXXXXX)}
mkdir -p "$logs"
lane_start=$EPOCHREALTIME
export CUDA_VISIBLE_DEVICES=""

say() { echo "[compat_lane] $*"; }
since() { awk -v now="$EPOCHREALTIME" -v then="$1" -v f="$2" 'BEGIN { printf f, now - then }'; }
die() { say "$*"; exit 2; }

torch_version() { "$py" -c 'import torch; print(torch.__version__)' 2>/dev/null; }
torch_right() { case "$(torch_version)" in "$TORCH_VERSION"|"$TORCH_VERSION"+*) return 0 ;; *) return 1 ;; esac; }
# The project imports from this checkout, and the .pth hook (CMakeLists.txt) is installed.
project_here() {
  "$py" - "$root" <<'EOF' >/dev/null 2>&1
import os, sys, importlib.util
import skrull_ext, torchtitan_patches, skrull_ext._core
root = os.path.realpath(sys.argv[1])
assert all(os.path.realpath(m.__file__).startswith(root + os.sep) for m in (skrull_ext, torchtitan_patches))
assert importlib.util.find_spec("_skrull_ext_compat") is not None
EOF
}

# The lane's own constraint, in place of any machine-wide one (see the header).
constraints=$logs/constraints.txt
printf 'torch==%s\ntriton==%s\n' "$TORCH_VERSION" "$TRITON_VERSION" >"$constraints"
export PIP_CONSTRAINT=$constraints

install_project() {
  say "pip install -e .[train,bench,test] (torch kept at $TORCH_VERSION; log: $logs/install.log)"
  "$py" -m pip install -e ".[train,bench,test]" >>"$logs/install.log" 2>&1 \
    || { tail -20 "$logs/install.log"; die "the project install failed"; }
}

build_venv() {
  say "building $VENV: torch==$TORCH_VERSION triton==$TRITON_VERSION first (~3 GB; log: $logs/install.log)"
  "${PYTHON:-python3}" -m venv "$VENV" || die "python -m venv failed"
  "$py" -m pip install -q --upgrade pip >>"$logs/install.log" 2>&1
  "$py" -m pip install "torch==$TORCH_VERSION" "triton==$TRITON_VERSION" >>"$logs/install.log" 2>&1 \
    || { tail -20 "$logs/install.log"; die "installing torch==$TORCH_VERSION failed"; }
}

if [ "$own_venv" = 1 ]; then
  if [ -x "$py" ] && ! torch_right; then
    say "$VENV has torch $(torch_version || echo none), not $TORCH_VERSION: rebuilding it"
    rm -rf "$VENV"
  fi
  [ -x "$py" ] || build_venv
  if [ "${REINSTALL:-0}" = 1 ] || ! project_here; then install_project; fi
elif [ ! -e "$VENV" ]; then  # VENV=/path not there yet: built there and kept
  build_venv
  install_project
else
  [ -x "$py" ] || die "VENV=$VENV has no bin/python"
  torch_right || die "VENV=$VENV has torch $(torch_version || echo none), not $TORCH_VERSION: left as it is"
  if [ "${REINSTALL:-0}" = 1 ]; then install_project; fi
  project_here || die "VENV=$VENV does not import skrull_ext and the .pth hook from $root: left as it is"
fi

# A core built before the C++ last changed fails most of the suite on a constructor's arguments:
# rebuild it (the project alone, --no-deps) rather than report that as the torch's failure.
core=$("$py" -c 'import skrull_ext._core as c; print(c.__file__)' 2>/dev/null)
if [ -n "$core" ] && newer=$(find cpp CMakeLists.txt pyproject.toml -type f -newer "$core" | head -1) && [ -n "$newer" ]; then
  say "the venv's C++ core is older than $newer: rebuilding it (pip install --no-deps -e .; log: $logs/install.log)"
  "$py" -m pip install --no-deps -e . >>"$logs/install.log" 2>&1 || { tail -20 "$logs/install.log"; die "rebuilding the core failed"; }
fi

version=$(torch_version)
case "$version" in
  "$TORCH_VERSION"|"$TORCH_VERSION"+*) say "torch $version, triton $("$py" -c 'import triton; print(triton.__version__)' 2>/dev/null || echo none), in $VENV" ;;
  *) die "torch.__version__ is '$version' in $VENV, not $TORCH_VERSION" ;;
esac

summary=()
failed=0
stage() {  # stage NAME COMMAND...: run it from the repo root with the venv first on PATH
  local name=$1; shift
  local start=$EPOCHREALTIME rc
  say "stage $name: $* (log: $logs/$name.log)"
  PATH="$VENV/bin:$PATH" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local line
  line=$(printf '%-7s rc=%-3s %6s s' "$name" "$rc" "$(since "$start" %.1f)")
  summary+=("$line")
  say "$line"
  if [ "$rc" != 0 ]; then
    failed=1
    { grep -E '^(FAILED|ERROR) ' "$logs/$name.log" || tail -15 "$logs/$name.log"; } | head -20 | sed 's/^/    /'
  fi
}

job=(-m skrull_ext.train --config-file skrull_ext/jobs/debug_cpu.toml --parallelism.context_parallel_degree 2)
stage quick "$py" -m pytest -m "not slow" -q -p no:cacheprovider
stage skrull "$VENV/bin/torchrun" --standalone --nproc_per_node 2 "${job[@]}" --dump_folder "$logs/dump-skrull"
stage packed "$VENV/bin/torchrun" --standalone --nproc_per_node 2 "${job[@]}" --skrull.no-enable \
  --dump_folder "$logs/dump-packed"
stage titan "$py" -m torchtitan.train --module skrull_ext.train --config llama3_debugmodel_cpu --training.steps 2 \
  --dump_folder "$logs/dump-titan"

echo "== compat lane: torch $version, $(since "$lane_start" %.0f) s wall, logs in $logs"
printf '%s\n' "${summary[@]}"
[ "$failed" = 0 ] && echo "== all stages passed" || echo "== FAILED"
exit "$failed"
