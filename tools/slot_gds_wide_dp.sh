#!/usr/bin/env bash
# Slot GDS at a wide DP before and after assign_slots took each slot's ranks
# off a heap (slots.hpp; before: commit fc42d3d, a scan of every rank for each
# group), in C++, on the same batches, one after the other in one run
# (docs/latency.md, "Slot GDS at a wide DP"). Run under nice on a shared box.
#
#   bash tools/slot_gds_wide_dp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/before_after_bins.sh
build_before_after fc42d3d slots.hpp tools/slot_gds_wide_dp.cpp
echo "| sequences | DP x CP | before ms | after ms | before / after | same plan |"
echo "|---:|---|---:|---:|---:|---|"
for n in 1 2000; do
  for dp in 1024 4096 16384 65536; do
    read -r b bd < <("$tmp/before_bin" "$n" "$dp")
    read -r a ad < <("$tmp/after_bin" "$n" "$dp")
    same=$([ "$bd" = "$ad" ] && echo yes || echo NO)
    awk -v n="$n" -v dp="$dp" -v b="$b" -v a="$a" -v same="$same" \
      'BEGIN { printf "| %d | %d x 8 | %.1f | %.1f | %.0fx | %s |\n", n, dp, b, a, b / a, same }'
  done
done
