// One-off measurement (docs/latency.md, "Look-ahead"): the same windows
// regrouped by the core's look-ahead as built against a given include
// directory, timed on one thread (wall and CPU). tools/lookahead_before_after.sh
// builds it twice, against the look-ahead of commit 8db97af (every candidate
// planned in full, before issue 54) and against this checkout's, so that
// both C++ versions run the same draws in one run. Not part of the product.
//
//   lookahead_before_after LENGTHS_FILE DP WINDOWS
//
// The job: tools/h200_lookahead_job.hpp (the H200 profile's cost model, policy skrull,
// lockstep, CP 8), 64 samples a DP rank, windows of 8.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "h200_lookahead_job.hpp"
#include "skrull/lookahead.hpp"
#include "skrull/scheduler.hpp"

using namespace skrull;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LENGTHS_FILE DP WINDOWS\n", argv[0]);
    return 2;
  }
  const std::vector<int64_t> pool = bench::read_lengths(argv[1]);
  const CostModel c = bench::h200_cost();
  Options o = bench::h200_options(std::atoi(argv[2]));
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
