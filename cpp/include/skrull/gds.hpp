// GDS (SKRULL.md, Algorithm 2 with its loop fixed): split a global batch
// over DP ranks, then each rank's share into micro-batches that DACP can
// schedule within memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/dacp_sweep.hpp"
#include "skrull/types.hpp"

namespace skrull {

// Longest-processing-time greedy by FLOPs: sequences by FLOPs descending
// (ties by index) each go to the DP rank with the least FLOPs so far (ties
// to the lower rank). Returns the global indices of each rank's share.
inline std::vector<std::vector<int32_t>> split_over_dp(const std::vector<int64_t>& lengths,
                                                       const std::vector<int32_t>& live, const CostModel& cost,
                                                       int32_t dp) {
  std::vector<int32_t> order = live;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return lengths[a] != lengths[b] ? lengths[a] > lengths[b] : a < b;  // FLOPs grow with length
  });
  std::vector<std::vector<int32_t>> bins(dp);
  std::vector<double> load(dp, 0.0);
  for (int32_t k : order) {
    const int32_t t = detail::argmin(load);
    bins[t].push_back(k);
    load[t] += cost.flops(lengths[k]);
  }
  return bins;
}

// One candidate split of a DP rank's share into m micro-batches.
struct MicroBatchSplit {
  bool feasible = false;
  double time_us = 0.0;
  std::vector<std::vector<int32_t>> groups;  // global indices, ascending length
  std::vector<DacpResult> dacp;
};

// Strided split of `sorted` (ascending length) into m groups, group j =
// sorted[j::m], which pairs long with short. Infeasible when a group holds
// more than cp * bucket tokens or DACP (dacp_for) cannot place it.
inline MicroBatchSplit split_strided(const std::vector<int64_t>& lengths, const std::vector<int32_t>& sorted,
                                     int32_t m, const CostModel& cost, const Options& opt) {
  MicroBatchSplit out;
  const int64_t capacity = opt.bucket_size * opt.cp;
  out.groups.resize(m);
  std::vector<int64_t> group_lengths;
  for (int32_t j = 0; j < m; ++j) {
    int64_t tokens = 0;
    for (size_t i = j; i < sorted.size(); i += m) {
      out.groups[j].push_back(sorted[i]);
      tokens += lengths[sorted[i]];
    }
    if (tokens > capacity) return out;
  }
  for (int32_t j = 0; j < m; ++j) {
    group_lengths.clear();
    for (int32_t k : out.groups[j]) group_lengths.push_back(lengths[k]);
    DacpResult r = dacp_for(group_lengths, cost, opt);
    if (r.status != Status::kOk) return out;
    out.time_us += r.time_us;
    out.dacp.push_back(std::move(r));
  }
  out.feasible = true;
  return out;
}

// Micro-batches of one DP rank: the smallest feasible count m, or (with
// MicroBatchCount::kPredictedTime) the feasible count among the smallest and
// the next max_extra_micro_batches with the least predicted time, ties to
// fewer micro-batches. A single sequence per micro-batch is always feasible
// for schedulable lengths, so the search ends by m = number of sequences.
inline MicroBatchSplit split_micro_batches(const std::vector<int64_t>& lengths, std::vector<int32_t> share,
                                           const CostModel& cost, const Options& opt) {
  std::sort(share.begin(), share.end(), [&](int32_t a, int32_t b) {
    return lengths[a] != lengths[b] ? lengths[a] < lengths[b] : a < b;
  });
  MicroBatchSplit best;
  best.feasible = true;  // an empty share has zero micro-batches
  if (share.empty()) return best;
  int64_t tokens = 0;
  for (int32_t k : share) tokens += lengths[k];
  const int64_t capacity = opt.bucket_size * opt.cp;
  const int32_t n = static_cast<int32_t>(share.size());
  int32_t m = static_cast<int32_t>(std::min<int64_t>(n, std::max<int64_t>(1, (tokens + capacity - 1) / capacity)));
  best.feasible = false;
  int32_t last = n;  // the highest m worth trying
  for (; m <= last; ++m) {
    MicroBatchSplit cand = split_strided(lengths, share, m, cost, opt);
    if (!cand.feasible) continue;
    if (!best.feasible) {
      best = std::move(cand);
      if (opt.micro_batch_count == MicroBatchCount::kSmallestFeasible) break;
      last = static_cast<int32_t>(std::min<int64_t>(n, static_cast<int64_t>(m) + opt.max_extra_micro_batches));
    } else if (cand.time_us < best.time_us) {
      best = std::move(cand);
    }
  }
  return best;
}

}  // namespace skrull
