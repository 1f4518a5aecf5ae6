// The job the one-off look-ahead measurements in C++ run (tools/lookahead_before_after.cpp,
// tools/lookahead_wide.cpp; docs/latency.md, "Look-ahead"): the cost model of
// profiles/h200-qwen2.5-0.5b-2026-11-28.toml as the profile loader turns it into a CostModel
// (Qwen2.5-0.5B shape, plan_margin 1.5; profiles/h200-qwen2.5-0.5b.toml holds the same numbers),
// the options of policy skrull, lockstep, overlength truncate, CP 8, BucketSize 130,622, and a
// shipped length file's lengths. Not part of the product.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"

namespace skrull::bench {

inline CostModel h200_cost() {
  CostModel c;
  c.shape = {24, 896, 128, 2, 1};
  c.a_us_per_flop = 1.0806023647733907e-08;
  c.b_us = 995.1806874735581;
  c.comm.bytes = {2097152.0, 4194304.0, 8388608.0, 16777216.0, 33554432.0,
                  67108864.0, 134217728.0, 268435456.0, 536870912.0, 1073741824.0};
  c.comm.us = {53.29, 72.52, 97.86, 199.3, 286.2, 488.6, 910.6, 1758.4, 3416.4, 6467.9};
  c.comm.plan_margin = 1.5;
  c.micro_batch_fixed_us = 22364.023690523427;
  c.token_us = 1.4997847136103983;
  c.attention_weight = 0.5567783586382529;
  return c;
}

inline Options h200_options(int32_t dp) {
  Options o;
  o.dp = dp;
  o.cp = 8;
  o.bucket_size = 130622;
  o.dacp_search = DacpSearch::kShardSweep;
  o.micro_batch_count = MicroBatchCount::kPredictedTime;
  o.overlength = Overlength::kTruncate;
  o.refine = true;
  o.slot_gds = true;
  return o;
}

// A shipped length file's lengths (skrull_ext/lengths/NAME.lengths.txt; '#' lines are comments).
inline std::vector<int64_t> read_lengths(const char* path) {
  std::ifstream f(path);
  std::vector<int64_t> pool;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty() && line[0] != '#') pool.push_back(std::stoll(line));
  return pool;
}

}  // namespace skrull::bench
