// The one public entry point of the core: schedule a global batch.
//
// A pure function of (lengths, cost model, options): every DP and CP rank
// that calls it with the same inputs gets the same plan, bit for bit, so no
// rank needs to talk to another to agree on it.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/gds.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

// Schedules one global batch (lengths in the caller's order) over dp x cp
// ranks. Empty batch -> empty plan (no micro-batches). Throws
// std::invalid_argument for bad options, a cost model it cannot use, a
// length <= 0 or above kMaxLength, or an over-length sequence under
// Overlength::kError.
inline Schedule schedule(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt) {
  const auto start = std::chrono::steady_clock::now();
  validate_options(opt);
  cost.validate();
  validate_lengths(input, "global batch");
  if (static_cast<int64_t>(input.size()) * opt.cp > kMaxSequenceRanks)
    throw std::invalid_argument("global batch has " + std::to_string(input.size()) + " sequences x cp " +
                                std::to_string(opt.cp) + " = " +
                                std::to_string(static_cast<int64_t>(input.size()) * opt.cp) + ", more than the limit " +
                                std::to_string(kMaxSequenceRanks) + " (the plan would not fit in memory)");

  Schedule out;
  const int32_t k_total = static_cast<int32_t>(input.size());
  const int64_t limit = max_sequence_length(opt.bucket_size, opt.cp);
  out.lengths = input;
  out.dp_rank.assign(k_total, kDropped);
  out.micro_batch.assign(k_total, -1);
  out.cp_rank.assign(k_total, kDistributed);
  std::vector<int32_t> live;
  live.reserve(k_total);
  for (int32_t k = 0; k < k_total; ++k) {
    const int64_t s = input[k];
    if (s > limit) {
      if (opt.overlength == Overlength::kError)
        throw std::invalid_argument("sequence " + std::to_string(k) + " has length " + std::to_string(s) +
                                    ", longer than the " + std::to_string(limit) +
                                    " tokens a CP group can hold (bucket_size " + std::to_string(opt.bucket_size) +
                                    " x cp " + std::to_string(opt.cp) +
                                    "); raise bucket_size or cp, or set overlength to 'truncate' or 'drop'");
      if (opt.overlength == Overlength::kDrop) {
        out.dropped.push_back(k);
        continue;
      }
      out.lengths[k] = limit;
      out.truncated.push_back(k);
    }
    live.push_back(k);
  }

  std::vector<double> flops;  // per sequence, computed once for every step below
  detail::sequence_flops(out.lengths.data(), out.lengths.size(), cost, flops);
  const auto shares = split_over_dp(out.lengths, flops, live, opt.dp);
  Workspace ws;
  std::vector<int32_t> sorted;
  std::vector<int64_t> group_lengths;
  std::vector<double> group_flops;
  out.dp_offsets.reserve(opt.dp + 1);
  out.dp_time_us.reserve(opt.dp);
  out.dp_offsets.push_back(0);
  for (int32_t i = 0; i < opt.dp; ++i) {
    detail::reverse_to_ascending(out.lengths, shares[i], sorted);
    const MicroBatchSplit split = split_micro_batches(out.lengths, flops, sorted, cost, opt, ws);
    if (!split.feasible)  // unreachable for lengths <= limit; kept as a guard
      throw std::logic_error("no micro-batch split found for DP rank " + std::to_string(i));
    double rank_time = 0.0;
    for (int32_t j = 0; j < split.m; ++j) {
      MicroBatch mb;
      mb.dp_rank = i;
      mb.index = j;
      const size_t size = (sorted.size() - j + split.m - 1) / split.m;
      mb.seqs.reserve(size);
      mb.dacp.cp_rank.reserve(size);
      group_lengths.clear();
      group_flops.clear();
      for (size_t p = j; p < sorted.size(); p += split.m) {
        const int32_t k = sorted[p];
        mb.seqs.push_back(k);
        mb.dacp.cp_rank.push_back(split.placement[p]);
        group_lengths.push_back(out.lengths[k]);
        group_flops.push_back(flops[k]);
        out.dp_rank[k] = i;
        out.micro_batch[k] = j;
        out.cp_rank[k] = split.placement[p];
      }
      mb.dacp.rollbacks = split.rollbacks[j];
      mb.dacp.moves = split.moves[j];
      score_placement(group_lengths.data(), group_flops.data(), group_lengths.size(), cost, opt.cp, mb.dacp);
      rank_time += mb.dacp.time_us;
      out.rollbacks += mb.dacp.rollbacks;
      out.moves += mb.dacp.moves;
      out.micro_batches.push_back(std::move(mb));
    }
    out.dp_time_us.push_back(rank_time);
    out.makespan_us = std::max(out.makespan_us, rank_time);
    out.dp_offsets.push_back(static_cast<int32_t>(out.micro_batches.size()));
  }
  out.elapsed_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace skrull
