// The one plan type (types.hpp, Plan): micro-batches at slots on blocks of
// CP groups, each sequence on a rank set. Every policy's answer is a Plan:
// skrull-pool builds one directly (pool.hpp); skrull's GDS + DACP answer
// (scheduler.hpp, Schedule: per DP rank, micro-batches back to back, the
// paper's form) is its one-group case, turned into a Plan by to_plan():
// micro-batch j of DP rank i is slot j on group i alone, a local sequence
// on one rank, a distributed one on the whole group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "skrull/chunked.hpp"
#include "skrull/timeline.hpp"
#include "skrull/types.hpp"

namespace skrull {

namespace detail {

// Skrull's micro-batches in the plan's form; same times, summed in the same
// order (group_time_us is each group's free-running finish, makespan_us the
// Schedule's). Leaves the per-sequence arrays to index_plan.
inline void plan_from_schedule(const Schedule& s, int32_t cp, Plan& out) {
  const int32_t dp = static_cast<int32_t>(s.dp_time_us.size());
  out.micro_batches.clear();
  out.micro_batches.reserve(s.micro_batches.size());
  out.group_time_us.assign(dp, 0.0);
  out.slots = 0;
  for (const MicroBatch& mb : s.micro_batches) {
    PlanMicroBatch p;
    p.slot = mb.index;
    p.first_group = mb.dp_rank;
    p.seqs = mb.seqs;
    p.first_rank.resize(mb.seqs.size());
    p.num_ranks.resize(mb.seqs.size());
    for (size_t q = 0; q < mb.seqs.size(); ++q) {
      const int32_t c = mb.dacp.cp_rank[q];
      const bool dist = c == kDistributed;
      p.first_rank[q] = mb.dp_rank * cp + (dist ? 0 : c);
      p.num_ranks[q] = dist ? cp : 1;
    }
    p.rank_tokens = mb.dacp.rank_tokens;
    p.rank_flops = mb.dacp.rank_flops;
    p.comm_bytes = mb.dacp.comm_bytes;
    p.time_us = mb.dacp.time_us;
    p.start_us = out.group_time_us[mb.dp_rank];
    out.group_time_us[mb.dp_rank] += mb.dacp.time_us;
    p.rollbacks = mb.dacp.rollbacks;
    p.moves = mb.dacp.moves;
    out.slots = std::max(out.slots, mb.index + 1);
    out.micro_batches.push_back(std::move(p));
  }
  out.makespan_us = s.makespan_us;
  out.rollbacks = s.rollbacks;
  out.moves = s.moves;
  out.widened = 0;
}

// Orders micro-batches by (slot, first group) and indexes sequences by them
// (micro_batch, first_rank, num_ranks must already have one entry per sequence).
inline void index_plan(Plan& out) {
  std::stable_sort(out.micro_batches.begin(), out.micro_batches.end(),
                   [](const PlanMicroBatch& a, const PlanMicroBatch& b) {
                     return a.slot != b.slot ? a.slot < b.slot : a.first_group < b.first_group;
                   });
  for (size_t m = 0; m < out.micro_batches.size(); ++m) {
    const PlanMicroBatch& mb = out.micro_batches[m];
    for (size_t q = 0; q < mb.seqs.size(); ++q) {
      out.micro_batch[mb.seqs[q]] = static_cast<int32_t>(m);
      out.first_rank[mb.seqs[q]] = mb.first_rank[q];
      out.num_ranks[mb.seqs[q]] = mb.num_ranks[q];
    }
  }
}

// Replays the slots after micro-batch times changed: in (slot, first group)
// order each starts when all its groups are free; each group's chunked
// documents, and on lockstep its pad chunks (at chunked_pad_us), run after
// its micro-batches (timeline.hpp's after_us, chunked.hpp's chunked_after).
// makespan_us is the step on the job's timeline (timeline.hpp), start_us
// each one's start on it; group_time_us stays each group's free-running finish.
// step_us: CostModel::step_fixed_us, added once to makespan_us.
inline void retime_plan(Plan& out, Timeline timeline, double pad_us, double step_us = 0.0) {
  std::vector<SlotTime> slots;
  slots.reserve(out.micro_batches.size());
  for (const PlanMicroBatch& mb : out.micro_batches) slots.push_back({mb.slot, mb.first_group, mb.groups, mb.time_us});
  std::vector<double> start;
  const int32_t dp = static_cast<int32_t>(out.group_time_us.size());
  const std::vector<double> after = chunked_after(
      out.chunked_us, out.chunked_group, dp, timeline,
      out.chunked_pad_us.empty() ? std::vector<double>(dp, 0.0) : out.chunked_pad_us);
  out.makespan_us = plan_step_time_us(slots, dp, timeline, pad_us, &out.group_time_us, &start, step_us, &after);
  for (size_t m = 0; m < out.micro_batches.size(); ++m) out.micro_batches[m].start_us = start[m];
}

}  // namespace detail

// Skrull's Schedule as a Plan on a CP size of `cp`, timed on `timeline` (a
// pad pass costs pad_us, a step step_us once): the same micro-batches,
// placements, times and step time; skrull_plan is set, nothing is widened or
// narrowed.
inline Plan to_plan(const Schedule& s, int32_t cp, Timeline timeline, double pad_us, double step_us = 0.0) {
  Plan out;
  const size_t n = s.lengths.size();
  out.lengths = s.lengths;
  out.micro_batch.assign(n, -1);
  out.first_rank.assign(n, 0);
  out.num_ranks.assign(n, 0);
  detail::plan_from_schedule(s, cp, out);
  detail::index_plan(out);
  out.chunked_us = s.chunked_us;
  out.chunked_group = s.chunked_dp_rank;
  out.chunked_chunks = s.chunked_chunks;
  out.chunked_pad_us = s.chunked_pad_us;
  detail::retime_plan(out, timeline, pad_us, step_us);
  out.dropped = s.dropped;
  out.truncated = s.truncated;
  out.skrull_plan = true;
  out.elapsed_us = s.elapsed_us;
  return out;
}

}  // namespace skrull
