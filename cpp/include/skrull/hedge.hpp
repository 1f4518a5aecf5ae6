// Planning against a dearer exchange (CommModel::plan_margin).
//
// Under the overlap formula a rank's exchange is free up to the local
// compute beside it and fully exposed past it. A plan made with the exchange
// priced too cheap fills that overlap to its edge (DACP shards sequences
// until the exchange just fits under the local work) and pays whatever the
// real exchange costs beyond it on every layer; one made with it priced too
// dear only shards a little less than it could. Where the comm table is
// assumed rather than measured, the planner therefore decides with the
// exchange at plan_margin x its price (planning_model) and the plan it keeps
// is priced again at 1x (reprice_schedule; pool.hpp for skrull-pool's
// plans): its times describe what the trainer runs under the model, only its
// choices are hedged. plan_margin == 1 plans and prices with one model, the
// same code path as before the hedge (docs/design/cost_model.md, "Planning
// against a dearer exchange").
#pragma once

#include <cstdint>
#include <vector>

#include "skrull/chunked.hpp"
#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/timeline.hpp"
#include "skrull/types.hpp"

namespace skrull {

inline bool hedged(const CostModel& cost) { return cost.comm.plan_margin != 1.0; }

// The model the planner decides with: every exchange at plan_margin x its
// price (comm_us scales with collectives_per_layer, the cross-group factor
// applies on top), nothing else changed; itself unhedged.
inline CostModel planning_model(const CostModel& cost) {
  CostModel out = cost;
  out.comm.collectives_per_layer *= cost.comm.plan_margin;
  out.comm.plan_margin = 1.0;
  return out;
}

namespace detail {

// Each DP rank's time (its micro-batches back to back, then its chunked
// documents and, on lockstep, their pad chunks: chunked_after; free-running
// at DP > 1, the pad pass of a rank with no micro-batch: add_idle_pads) and
// the step on the job's timeline, from the micro-batches' times.
inline void time_schedule(Schedule& s, const CostModel& cost, const Options& opt) {
  std::vector<std::vector<double>> rank_us(opt.dp);
  s.dp_time_us.assign(opt.dp, 0.0);
  for (int32_t i = 0; i < opt.dp; ++i) {
    for (int32_t q = s.dp_offsets[i]; q < s.dp_offsets[i + 1]; ++q) {
      rank_us[i].push_back(s.micro_batches[q].dacp.time_us);
      s.dp_time_us[i] += s.micro_batches[q].dacp.time_us;
    }
  }
  s.chunked_pad_us =
      lockstep_pad_us({s.chunked_us, s.chunked_chunks, s.chunked_lengths, s.chunked_last_chunk}, s.chunked_dp_rank,
                      opt.dp, opt.cp, cost);
  const std::vector<double> after = chunked_after(s.chunked_us, s.chunked_dp_rank, opt.dp, opt.timeline,
                                                  s.chunked_pad_us);
  for (int32_t i = 0; i < opt.dp; ++i) s.dp_time_us[i] += after[i];
  add_idle_pads(s.dp_time_us, rank_us, opt.timeline, cost.pad_pass_us(), &after);
  s.makespan_us = step_time_us(rank_us, opt.timeline, cost.pad_pass_us(), cost.step_fixed_us, &after);
}

}  // namespace detail

// Skrull's schedule priced under `cost`: every micro-batch scored as it is
// placed (what DACP's own scoring gives under `cost`), then the ranks' sums
// and the step.
inline void reprice_schedule(Schedule& s, const CostModel& cost, const Options& opt) {
  std::vector<int64_t> lengths;
  std::vector<double> flops;
  for (MicroBatch& mb : s.micro_batches) {
    lengths.clear();
    for (int32_t k : mb.seqs) lengths.push_back(s.lengths[k]);
    detail::sequence_flops(lengths.data(), lengths.size(), cost, flops);
    score_placement(lengths.data(), flops.data(), lengths.size(), cost, opt.cp, mb.dacp);
  }
  detail::time_schedule(s, cost, opt);
}

}  // namespace skrull
