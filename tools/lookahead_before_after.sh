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
. tools/before_after_bins.sh
build_before_after 8db97af lookahead.hpp tools/lookahead_before_after.cpp -DSKRULL_LOOKAHEAD_BEFORE
echo "| look-ahead | DP x CP | windows | planning ms (wall / CPU) | predicted window ms | share (CPU) | predicted gain |"
echo "|---|---|---:|---:|---:|---:|---:|"
for dp in 4 16 64 128; do
  for side in before after; do
    printf '| %s ' "$side"
    "$tmp/${side}_bin" "skrull_ext/lengths/$name.lengths.txt" "$dp" "$windows"
  done
done
