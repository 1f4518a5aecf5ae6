#!/usr/bin/env bash
# Slot GDS with many sequences a batch before and after form_groups parked
# the groups without room (gds.hpp; before: commit 5dc4b5a, every such group
# set aside and pushed back for each sequence), in C++, on the same batches
# drawn from the shipped ShareGPT + 5% LongBench mix, one after the other in
# one run (docs/latency.md, "Many sequences a batch"). Run under nice on a
# shared box.
#
#   bash tools/lpt_groups_many.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/before_after_bins.sh
build_before_after 5dc4b5a gds.hpp tools/slot_gds_wide_dp.cpp
lengths=skrull_ext/lengths/mix_sharegpt_conv95+longbench_en5.lengths.txt
echo "| sequences | DP x CP | before ms | after ms | before / after | same plan |"
echo "|---:|---|---:|---:|---:|---|"
for n in 8192 16384 32768 49152 65536 131072; do
  read -r b bd < <("$tmp/before_bin" "$n" 128 "$lengths")
  read -r a ad < <("$tmp/after_bin" "$n" 128 "$lengths")
  same=$([ "$bd" = "$ad" ] && echo yes || echo NO)
  awk -v n="$n" -v b="$b" -v a="$a" -v same="$same" \
    'BEGIN { printf "| %d | 128 x 8 | %.1f | %.1f | %.1fx | %s |\n", n, b, a, b / a, same }'
done
