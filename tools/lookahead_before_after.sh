#!/usr/bin/env bash
# The look-ahead before issue 54 (commit 8db97af: every candidate planned in
# full) and this checkout's, in C++, on the same windows, one after the other
# in one run (docs/latency.md, "Look-ahead"). Run under nice on a shared box.
#
#   bash tools/lookahead_before_after.sh [LENGTHS_NAME] [WINDOWS]
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-mix_sharegpt_conv95+longbench_en5}
windows=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/before/skrull"
cp cpp/include/skrull/*.hpp "$tmp/before/skrull/"
git show 8db97af:cpp/include/skrull/lookahead.hpp > "$tmp/before/skrull/lookahead.hpp"
flags=(-O2 -std=c++17 -ffp-contract=off)
g++ "${flags[@]}" -I"$tmp/before" -DSKRULL_LOOKAHEAD_BEFORE tools/lookahead_before_after.cpp -o "$tmp/before_bin"
g++ "${flags[@]}" -Icpp/include tools/lookahead_before_after.cpp -o "$tmp/after_bin"
echo "| look-ahead | DP x CP | windows | planning ms (wall / CPU) | predicted window ms | share (CPU) | predicted gain |"
echo "|---|---|---:|---:|---:|---:|---:|"
for dp in 4 16 64 128; do
  for side in before after; do
    printf '| %s ' "$side"
    "$tmp/${side}_bin" "skrull_ext/lengths/$name.lengths.txt" "$dp" "$windows"
  done
done
