// One-off measurement (docs/latency.md, "Slot GDS at a wide DP"): slot GDS on
// a lockstep timeline at DP 1,024 to 65,536, built against a given include
// directory and timed on one thread. tools/slot_gds_wide_dp.sh builds it
// twice, against slots.hpp as it was (assign_slots scanning every rank for
// each group: O(dp^2) a slot) and this checkout's, so both run the same
// batches in one run. Not part of the product.
//
//   slot_gds_wide_dp N DP [LENGTHS]
//
// Prints the call's milliseconds (best of 3) and a digest of the plan (each
// sequence's DP rank, micro-batch and CP rank, the step time): equal digests
// say both versions made the same plan. The cost model is the core's default
// (CostModel{}) with a one-point comm table; CP 8, BucketSize 26,624, N
// sequences of 100 to 4,099 tokens (a fixed draw), or drawn from LENGTHS (a
// lengths file: one length a line, '#' comments) and cut to what a CP group
// holds (docs/latency.md, "Many sequences a batch": tools/lpt_groups_many.sh).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "skrull/scheduler.hpp"

using namespace skrull;

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s N DP [LENGTHS]\n", argv[0]);
    return 2;
  }
  const int64_t n = std::atoll(argv[1]);
  CostModel c;
  c.comm.bytes = {1.0};
  c.comm.us = {50.0};
  Options o;
  o.dp = std::atoi(argv[2]);
  o.cp = 8;
  o.bucket_size = 26624;
  o.slot_gds = true;
  o.timeline = Timeline::kLockstep;
  std::vector<int64_t> lengths;
  uint64_t seed = 7;
  std::vector<int64_t> pool;
  if (argc == 4) {
    std::ifstream in(argv[3]);
    const int64_t cap = max_sequence_length(o.bucket_size, o.cp);
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line[0] != '#') pool.push_back(std::min<int64_t>(std::stoll(line), cap));
    if (pool.empty()) {
      std::fprintf(stderr, "%s: no lengths\n", argv[3]);
      return 2;
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    lengths.push_back(pool.empty() ? 100 + static_cast<int64_t>((seed >> 33) % 4000) : pool[(seed >> 33) % pool.size()]);
  }
  double best = 1e300;
  Schedule s;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    s = schedule(lengths, c, o);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  uint64_t h = 1469598103934665603ull;
  const auto add = [&h](const void* p, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  add(s.dp_rank.data(), s.dp_rank.size() * 4);
  add(s.micro_batch.data(), s.micro_batch.size() * 4);
  add(s.cp_rank.data(), s.cp_rank.size() * 4);
  add(&s.makespan_us, sizeof s.makespan_us);
  std::printf("%.3f %016llx\n", best, static_cast<unsigned long long>(h));
  return 0;
}
