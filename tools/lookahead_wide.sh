#!/usr/bin/env bash
# Wide look-ahead windows before and after the screen's ladder (docs/latency.md,
# "Look-ahead": wide windows): the look-ahead of commit acb366a (every k = 1..W
# screened for each fraction) and this checkout's, in C++, on the same windows,
# one after the other in one run, with the CPU ratio and the predicted gains.
# Run under nice on a shared box.
#
#   bash tools/lookahead_wide.sh [LENGTHS_NAME]
#
# Each row: one window of W global batches of 64 samples a DP rank. The before
# side at DP 128 x CP 8, W = 1024 is not run (5,120 candidates of 8.4 million
# samples: 1,491 s of CPU); BEFORE_1024=1 runs it, without its phase columns.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-mix_sharegpt_conv95+longbench_en5}
lengths="skrull_ext/lengths/$name.lengths.txt"
. tools/before_after_bins.sh
build_before_after acb366a lookahead.hpp tools/lookahead_wide.cpp -DSKRULL_LOOKAHEAD_EVERY_K
echo "| look-ahead | DP x CP | W | windows | CPU s | wall s | share (CPU) | predicted gain | screened | priced in full | plans s | building s | screening s | rest s | k chosen |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
ratios=()
for dp in 128 4; do
  for w in 8 64 256 1024; do
    windows=$([ "$w" -le 8 ] && echo 3 || echo 1)
    after=$("$tmp/after_bin" "$lengths" "$dp" "$w" "$windows")
    if [ "$dp" = 128 ] && [ "$w" = 1024 ] && [ "${BEFORE_1024:-0}" != 1 ]; then
      echo "| before | $dp x 8 | $w | - | not run (BEFORE_1024=1) | | | | | | | | | | |"
      echo "| after $after"
      continue
    fi
    phases=$([ "$dp" = 128 ] && [ "$w" = 1024 ] && echo 0 || echo 1)
    before=$("$tmp/before_bin" "$lengths" "$dp" "$w" "$windows" "$phases")
    echo "| before $before"
    echo "| after $after"
    # Fields split on "|": 5 CPU s, 8 gain.
    ratios+=("$(awk -F'|' -v b="$before" -v a="$after" -v dp="$dp" -v w="$w" 'BEGIN {
      split(b, x, "|"); split(a, y, "|"); gsub(/[ x]/, "", x[8]); gsub(/[ x]/, "", y[8]);
      printf "DP %s x CP 8, W %s: CPU before / after x%.1f; predicted gain after / before %.4f", dp, w, x[5] / y[5], y[8] / x[8] }')")
  done
done
echo
printf '%s\n' "${ratios[@]}"
