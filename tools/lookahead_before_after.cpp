// One-off measurement (docs/latency.md, "Look-ahead"): the same windows
// regrouped by the core's look-ahead as built against a given include
// directory, timed on one thread (wall and CPU). tools/lookahead_before_after.sh
// builds it twice, against the look-ahead of commit 8db97af (every candidate
// planned in full, before issue 54) and against this checkout's, so that
// both C++ versions run the same draws in one run. Not part of the product.
//
//   lookahead_before_after LENGTHS_FILE DP WINDOWS
//
// The cost model is profiles/h200-qwen2.5-0.5b.toml as the profile loader
// turns it into a CostModel (Qwen2.5-0.5B shape, plan_margin 1.5), the
// options those of policy skrull, lockstep, overlength truncate, CP 8,
// BucketSize 130,622, 64 samples a DP rank, windows of 8.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "skrull/lookahead.hpp"
#include "skrull/scheduler.hpp"

using namespace skrull;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LENGTHS_FILE DP WINDOWS\n", argv[0]);
    return 2;
  }
  std::ifstream f(argv[1]);
  std::vector<int64_t> pool;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty() && line[0] != '#') pool.push_back(std::stoll(line));
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
  Options o;
  o.dp = std::atoi(argv[2]);
  o.cp = 8;
  o.bucket_size = 130622;
  o.dacp_search = DacpSearch::kShardSweep;
  o.micro_batch_count = MicroBatchCount::kPredictedTime;
  o.overlength = Overlength::kTruncate;
  o.refine = true;
  o.slot_gds = true;
  const int windows = std::atoi(argv[3]);
  const auto step_time = [&](const std::vector<int64_t>& l) { return schedule(l, c, o).makespan_us; };
  std::mt19937_64 rng(1);
  const int64_t limit = max_sequence_length(o.bucket_size, o.cp);
  double arrival = 0, chosen = 0, wall = 0, cpu = 0;
  for (int k = 0; k < windows; ++k) {
    std::vector<std::vector<int64_t>> b(8);
    for (auto& batch : b)
      for (int i = 0; i < 64 * o.dp; ++i) batch.push_back(std::min(limit, pool[rng() % pool.size()]));
    const auto w0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
#ifdef SKRULL_LOOKAHEAD_BEFORE
    const Lookahead a = lookahead(b, c, step_time);
#else
    const Lookahead a = lookahead(b, c, o, step_time);
#endif
    cpu += static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    arrival += a.arrival_window_us;
    chosen += a.window_us;
  }
  std::printf("| %d x 8 | %d | %.0f / %.0f | %.0f | %.2f%% | x%.4f |\n", o.dp, windows, 1e3 * wall / windows,
              1e3 * cpu / windows, chosen / 1e3 / windows, 100 * cpu / (chosen / 1e6), arrival / chosen);
  return 0;
}
