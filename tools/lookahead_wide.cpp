// One-off measurement (docs/latency.md, "Look-ahead": wide windows): the
// core's look-ahead on windows of W global batches, timed on one thread, with
// where the time goes. tools/lookahead_wide.sh builds it twice, against the
// look-ahead of a given commit (SKRULL_LOOKAHEAD_EVERY_K: every k = 1..W
// screened) and against this checkout's, so that both run the same draws in
// one run. Not part of the product.
//
//   lookahead_wide LENGTHS_FILE DP W WINDOWS [PHASES]
//
// PHASES 0 leaves out the candidates' second construction and screening
// (their columns read 0, the rest column holds them).
// Prints one table row: the call's CPU and wall time per window, its share of
// the window's predicted time, the predicted gain (arrival order over the
// chosen grouping, both by full plans), the candidates screened and priced,
// and the CPU time of the call's parts: the full step plans (timed inside
// the step planner the call is given), the candidates' construction and
// their screening (the same candidates rebuilt and estimated again outside
// the call, with the header's own functions), and the rest (the finalists'
// bookkeeping and the swap search).
//
// The job: tools/h200_lookahead_job.hpp (the H200 profile's cost model, policy skrull,
// lockstep, CP 8), 64 samples a DP rank.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "h200_lookahead_job.hpp"
#include "skrull/lookahead.hpp"
#include "skrull/scheduler.hpp"

using namespace skrull;

namespace {

double cpu_s() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// The k values the look-ahead under test screens for a window of w steps.
std::vector<int32_t> screened_k(int32_t w) {
#ifdef SKRULL_LOOKAHEAD_EVERY_K
  std::vector<int32_t> ks(w);
  std::iota(ks.begin(), ks.end(), 1);
  return ks;
#else
  return detail::screened_steps(w);
#endif
}

// CPU seconds to build and to estimate every long-first candidate and the sort of one window, as the call does.
std::pair<double, double> candidate_phases(const std::vector<std::vector<int64_t>>& batches, const CostModel& c,
                                           const Options& o) {
  const int32_t w = static_cast<int32_t>(batches.size());
  std::vector<int64_t> lengths;
  std::vector<int32_t> counts;
  for (const auto& b : batches) {
    lengths.insert(lengths.end(), b.begin(), b.end());
    counts.push_back(static_cast<int32_t>(b.size()));
  }
  const int32_t n = static_cast<int32_t>(lengths.size());
  std::vector<double> flops, sample_cost(n);
  detail::sequence_flops(lengths.data(), lengths.size(), c, flops);
  const StepEstimator est(c, o);
  for (int32_t q = 0; q < n; ++q) sample_cost[q] = est.cost(flops[q]);
  std::vector<int32_t> order(n), scratch, step;
  std::iota(order.begin(), order.end(), 0);
  detail::sort_descending_by_length(lengths, order, scratch);
  const std::vector<ChunkedDocs> chunked(w);
  const detail::Screen screen(est, lengths, sample_cost, order, chunked);
  double build = 0.0, estimate = 0.0, sink = 0.0;
  int32_t last_m = 0;
  for (double f : kLookaheadFractions) {
    const int32_t m = std::max<int32_t>(1, static_cast<int32_t>(f * n + 0.5));
    if (m == last_m || m >= n) continue;
    last_m = m;
    for (int32_t k : screened_k(w)) {
      const double t0 = cpu_s();
      const bool ok = detail::long_first(flops, order, m, counts, k, step);
      const double t1 = cpu_s();
      build += t1 - t0;
      if (!ok) continue;
      sink += screen.total(step, w);
      estimate += cpu_s() - t1;
    }
  }
  std::printf("%s", sink < 0 ? " " : "");  // keeps the estimates from being optimised away
  return {build, estimate};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s LENGTHS_FILE DP W WINDOWS [PHASES]\n", argv[0]);
    return 2;
  }
  const std::vector<int64_t> pool = bench::read_lengths(argv[1]);
  const CostModel c = bench::h200_cost();
  Options o = bench::h200_options(std::atoi(argv[2]));
  const int32_t w = std::atoi(argv[3]);
  const int windows = std::atoi(argv[4]);
  const bool phases = argc < 6 || std::atoi(argv[5]) != 0;
  double plan_cpu = 0.0;
  const auto step_time = [&](const std::vector<int64_t>& l) {
    const double t0 = cpu_s();
    const double us = schedule(l, c, o).makespan_us;
    plan_cpu += cpu_s() - t0;
    return us;
  };
  std::mt19937_64 rng(1);
  const int64_t limit = max_sequence_length(o.bucket_size, o.cp);
  double arrival = 0, chosen = 0, wall = 0, cpu = 0, build = 0, estimate = 0;
  int64_t screened = 0, candidates = 0, trials = 0, planned = 0, steps_k = 0;
  for (int k = 0; k < windows; ++k) {
    std::vector<std::vector<int64_t>> b(w);
    for (auto& batch : b)
      for (int i = 0; i < 64 * o.dp; ++i) batch.push_back(std::min(limit, pool[rng() % pool.size()]));
    const auto w0 = std::chrono::steady_clock::now();
    const double c0 = cpu_s();
    const Lookahead a = lookahead(b, c, o, step_time);
    cpu += cpu_s() - c0;
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    arrival += a.arrival_window_us;
    chosen += a.window_us;
    screened += a.screened;
    candidates += a.candidates;
    trials += a.swap_trials;
    planned += a.planned;
    steps_k += a.long_steps;
    if (!phases) continue;
    const auto [bs, es] = candidate_phases(b, c, o);
    build += bs;
    estimate += es;
  }
  const double n = windows;
  // | DP x CP | W | windows | CPU s | wall s | share | gain | screened | priced | plans s | build s | screen s | rest s | k |
  std::printf("| %d x 8 | %d | %d | %.2f | %.2f | %.2f%% | x%.4f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.0f |\n",
              o.dp, w, windows, cpu / n, wall / n, 100 * cpu / (chosen / 1e6), arrival / chosen, screened / n,
              candidates / n, plan_cpu / n, build / n, estimate / n, (cpu - plan_cpu - build - estimate) / n,
              steps_k / n);
  std::fflush(stdout);
  return 0;
}
