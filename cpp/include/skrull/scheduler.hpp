// The core's entry point for policy skrull: schedule a global batch
// (schedule_pool, pool.hpp, and lookahead, lookahead.hpp, are the others).
//
// A pure function of (lengths, cost model, options): every DP and CP rank
// that calls it with the same inputs gets the same plan, bit for bit, so no
// rank needs to talk to another to agree on it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "skrull/chunked.hpp"
#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/gds.hpp"
#include "skrull/hedge.hpp"
#include "skrull/overlength.hpp"
#include "skrull/slots.hpp"
#include "skrull/timeline.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

namespace detail {

// One DP rank's share (ascending) split into micro-batches (Algorithm 2's
// strided groups); with MicroBatchCount::kPredictedTime also by LPT groups
// (slots.hpp's grouping) whenever the strided count is above the token
// bound ceil(tokens / (cp C)), the faster predicted one kept (ties to
// strided). Strided groups pair long with short, so they need more
// micro-batches than the tokens do when two long ones land in one group:
// on the debug job's data (DP 1 x CP 2, C = 256) lengths 456, 97, 29, 25,
// 22, 17, 9, 2 took 3 strided micro-batches where LPT packs 2, and a
// sequence that fills a micro-batch alone (one at C x CP) makes every count
// infeasible until each sequence has a micro-batch of its own. At the token
// bound LPT cannot use fewer, and strided's pairing is the paper's.
inline MicroBatchSplit split_share(const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                                   const std::vector<int32_t>& share, const CostModel& cost, const Options& opt,
                                   Workspace& ws) {
  MicroBatchSplit split = split_micro_batches(lengths, flops, share, cost, opt, ws);
  if (opt.micro_batch_count != MicroBatchCount::kPredictedTime || !split.feasible) return split;
  int64_t tokens = 0;
  for (int32_t k : share) tokens += lengths[k];
  const int64_t capacity = group_capacity(opt.bucket_size, opt.cp);
  const int64_t token_bound = (tokens + capacity - 1) / capacity;
  if (split.m <= token_bound) return split;
  MicroBatchSplit lpt = split_micro_batches(lengths, flops, share, cost, opt, ws, 1, Grouping::kLpt);
  if (lpt.feasible && lpt.score_us < split.score_us) return lpt;
  return split;
}

// schedule() with one model for the choices and the prices, the chunked
// documents on the DP ranks `chunked_rank` gives; `around`: GDS starts each
// rank at its chunked load (else it splits the samples as without them).
inline Schedule schedule_assigned(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt,
                                  const ChunkedDocs& chunked, const std::vector<int32_t>& chunked_rank, bool around) {
  const auto start = std::chrono::steady_clock::now();
  validate_options(opt);
  cost.validate();
  validate_lengths(input, "global batch");
  validate_chunked(chunked);
  if (static_cast<int64_t>(input.size()) * opt.cp > kMaxSequenceRanks)
    throw std::invalid_argument("global batch has " + std::to_string(input.size()) + " sequences x cp " +
                                std::to_string(opt.cp) + " = " +
                                std::to_string(static_cast<int64_t>(input.size()) * opt.cp) + ", more than the limit " +
                                std::to_string(kMaxSequenceRanks) + " (the plan would not fit in memory)");

  Schedule out;
  const int32_t k_total = static_cast<int32_t>(input.size());
  LengthCut cut = cut_overlength(input, opt, {opt.cp, "a CP group", "bucket_size " + std::to_string(opt.bucket_size) +
                                              " x cp " + std::to_string(opt.cp), "bucket_size or cp"});
  out.lengths = std::move(cut.lengths);
  out.dropped = std::move(cut.dropped);
  out.truncated = std::move(cut.truncated);
  const std::vector<int32_t> live = std::move(cut.live);
  out.dp_rank.assign(k_total, kDropped);
  out.micro_batch.assign(k_total, -1);
  out.cp_rank.assign(k_total, kDistributed);
  // Chunked documents first (chunked.hpp): each on one DP rank, the samples then balanced around them.
  out.chunked_us = chunked.us;
  out.chunked_dp_rank = chunked_rank;
  out.chunked_chunks = chunked.chunks;
  out.chunked_lengths = chunked.lengths;
  out.chunked_last_chunk = chunked.last_chunk;
  const std::vector<double> chunked_start =
      chunked.empty() || !around ? std::vector<double>()
                      : chunked_flops(chunked_load(chunked.us, out.chunked_dp_rank, opt.dp), cost, opt.cp);

  std::vector<double> flops;  // per sequence, computed once for every step below
  detail::sequence_flops(out.lengths.data(), out.lengths.size(), cost, flops);
  Workspace ws;
  std::vector<int64_t> group_lengths;
  std::vector<double> group_flops;
  // Micro-batch j of DP rank i: group `g` of `split` over `sorted`.
  const auto emit = [&](int32_t i, int32_t j, const std::vector<int32_t>& sorted, const MicroBatchSplit& split,
                        int32_t g) {
    MicroBatch mb;
    mb.dp_rank = i;
    mb.index = j;
    const size_t size = split.member_start[g + 1] - split.member_start[g];
    mb.seqs.reserve(size);
    mb.dacp.cp_rank.reserve(size);
    group_lengths.clear();
    group_flops.clear();
    for (int32_t q = split.member_start[g]; q < split.member_start[g + 1]; ++q) {
      const int32_t p = split.members[q];
      const int32_t k = sorted[p];
      mb.seqs.push_back(k);
      mb.dacp.cp_rank.push_back(split.placement[p]);
      group_lengths.push_back(out.lengths[k]);
      group_flops.push_back(flops[k]);
      out.dp_rank[k] = i;
      out.micro_batch[k] = j;
      out.cp_rank[k] = split.placement[p];
    }
    mb.dacp.rollbacks = split.rollbacks[g];
    mb.dacp.moves = split.moves[g];
    score_placement(group_lengths.data(), group_flops.data(), group_lengths.size(), cost, opt.cp, mb.dacp);
    out.rollbacks += mb.dacp.rollbacks;
    out.moves += mb.dacp.moves;
    out.micro_batches.push_back(std::move(mb));
  };
  out.dp_offsets.reserve(opt.dp + 1);
  out.dp_offsets.push_back(0);
  if (opt.slot_gds && opt.dp > 1) {
    // Slot GDS (slots.hpp): the whole batch split into dp x c micro-batches,
    // grouped into slots of similar time, each slot spread over the ranks.
    std::vector<int32_t> sorted, scratch, descending = live;
    detail::sort_descending_by_length(out.lengths, descending, scratch);
    detail::reverse_to_ascending(out.lengths, descending, sorted);
    MicroBatchSplit split = split_micro_batches(out.lengths, flops, sorted, cost, opt, ws, opt.dp, Grouping::kLpt);
    if (!split.feasible)  // unreachable for lengths <= limit; kept as a guard
      throw std::logic_error("no slot split found for the global batch");
    // The leader slot (slots.hpp, step 4): the longest sequence's slot filled
    // to its time, the rest split after it; kept when its slot time is lower.
    MicroBatchSplit head;
    std::vector<int32_t> rest;
    const std::vector<int32_t>* split_of = &sorted;  // what `split`'s positions index
    bool lead = false;
    if (leader_slot_worth_trying(split.group_us, opt.dp, cost.micro_batch_fixed_us) &&
        leader_slot(out.lengths, flops, sorted, cost, opt, ws, head, rest) &&
        head.score_us + slots_lower_bound_us(out.lengths, flops, rest, cost, opt) < split.score_us) {
      MicroBatchSplit tail = split_micro_batches(out.lengths, flops, rest, cost, opt, ws, opt.dp, Grouping::kLpt);
      if (tail.feasible && head.score_us + tail.score_us < split.score_us) {
        std::swap(split, tail);
        split_of = &rest;
        lead = true;
      }
    }
    const int32_t first = lead ? 1 : 0;  // slot of the split's first run
    std::vector<char> empty(split.m);
    for (int32_t g = 0; g < split.m; ++g) empty[g] = split.member_start[g] == split.member_start[g + 1];
    std::vector<int32_t> rank, slot;
    assign_slots(split.group_us, empty, opt.dp, rank, slot, lead ? head.group_us : std::vector<double>());
    std::vector<std::vector<int32_t>> by_rank(opt.dp);  // groups of each rank, in slot order
    std::vector<int32_t> order(split.m);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&slot](int32_t a, int32_t b) { return slot[a] < slot[b]; });
    for (int32_t g : order)
      if (!empty[g] && rank[g] >= 0) by_rank[rank[g]].push_back(g);
    for (int32_t i = 0; i < opt.dp; ++i) {
      if (lead) emit(i, 0, sorted, head, i);  // group i of the leader slot on rank i
      for (size_t j = 0; j < by_rank[i].size(); ++j) {
        // Non-empty groups fill every rank's first slots (empties sort last).
        if (slot[by_rank[i][j]] != static_cast<int32_t>(j)) throw std::logic_error("slot GDS left a gap in a rank's slots");
        emit(i, first + static_cast<int32_t>(j), *split_of, split, by_rank[i][j]);
      }
      out.dp_offsets.push_back(static_cast<int32_t>(out.micro_batches.size()));
    }
  } else {
    // Algorithm 2: LPT over DP ranks (each starting at its chunked documents), then each rank's
    // share split on its own.
    const auto shares = split_over_dp(out.lengths, flops, live, opt.dp, chunked_start);
    std::vector<int32_t> sorted;
    for (int32_t i = 0; i < opt.dp; ++i) {
      detail::reverse_to_ascending(out.lengths, shares[i], sorted);
      const MicroBatchSplit split = detail::split_share(out.lengths, flops, sorted, cost, opt, ws);
      if (!split.feasible)  // unreachable for lengths <= limit; kept as a guard
        throw std::logic_error("no micro-batch split found for DP rank " + std::to_string(i));
      for (int32_t j = 0; j < split.m; ++j) emit(i, j, sorted, split, j);
      out.dp_offsets.push_back(static_cast<int32_t>(out.micro_batches.size()));
    }
  }
  // Times: each rank's sum, and the step on the job's timeline.
  time_schedule(out, cost, opt);
  out.elapsed_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return out;
}

// Free-running at DP > 1, what every rank runs at least besides its chunked
// documents: its micro-batches, each at least the micro-batch lower bound of
// the shortest sample (the bound grows with what a micro-batch holds; a
// truncated sample is at least the limit), or, with none, its pad pass
// (timeline.hpp idle_pad). So round robin's bound holds the pass that LPT's
// priced step holds, and is not planned for nothing where a rank holds only
// documents.
inline double least_pass_us(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt) {
  double least = cost.pad_pass_us();
  if (input.empty()) return least;
  const int64_t shortest = std::min(*std::min_element(input.begin(), input.end()),
                                    max_sequence_length(opt.bucket_size, opt.cp));
  return std::min(least, cost.micro_batch_lower_bound_us(&shortest, 1, opt.cp));
}

// schedule() with one model for the choices and the prices. Chunked
// documents: LPT's assignment (assign_chunked) with the samples planned
// around it, and, at DP > 1, round robin (document k on rank k mod dp, the
// order they came in) with the samples planned as without them (what the
// trainer ran before the plans knew of chunked documents); the lower step
// time wins, ties to LPT. Both are priced with the pad chunks lockstep ranks
// run (chunked_after), so the pads can decide between them. LPT is within
// 4/3 of the best split of the documents' times, and GDS around it is a
// heuristic: round robin can still come out ahead ([2, 3, 2, 3, 2] over 2
// ranks: 6 where LPT gives 7), and then a step is predicted no slower than it.
//
// What round robin costs: under slot GDS (the lockstep default) the samples'
// plan never reads the documents (their slots run before every rank's
// documents, whichever rank), so round robin's plan is LPT's with another
// assignment: it is priced by retiming, exactly, without a second plan.
// Otherwise it is planned only where LPT's step is above round robin's bound
// (its busiest rank's documents and pads), which a step whose documents
// dominate (free-running, most) does not leave it; under lockstep that bound
// leaves out every slot the samples take, so it rules out little there.
inline Schedule schedule_as_priced(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt,
                                   const ChunkedDocs& chunked) {
  const auto start = std::chrono::steady_clock::now();
  validate_options(opt);  // dp >= 1 before the assignment
  validate_chunked(chunked);
  std::vector<int32_t> lpt = assign_chunked(chunked.us, opt.dp), robin(chunked.size());
  for (size_t k = 0; k < robin.size(); ++k) robin[k] = static_cast<int32_t>(k % opt.dp);
  Schedule out = schedule_assigned(input, cost, opt, chunked, lpt, true);
  if (opt.dp > 1 && !chunked.empty()) {
    if (opt.slot_gds) {
      const double lpt_us = out.makespan_us;
      out.chunked_dp_rank = robin;
      time_schedule(out, cost, opt);
      if (!(out.makespan_us < lpt_us)) {
        out.chunked_dp_rank = lpt;
        time_schedule(out, cost, opt);
      }
    } else {
      const std::vector<double> robin_after = chunked_after(
          chunked.us, robin, opt.dp, opt.timeline, lockstep_pad_us(chunked, robin, opt.dp, opt.cp, cost));
      double robin_bound = *std::max_element(robin_after.begin(), robin_after.end()) + cost.step_fixed_us;
      if (opt.timeline == Timeline::kFreeRunning) robin_bound += least_pass_us(input, cost, opt);
      if (out.makespan_us > robin_bound) {
        Schedule other = schedule_assigned(input, cost, opt, chunked, robin, false);
        if (other.makespan_us < out.makespan_us) std::swap(out, other);
      }
    }
  }
  out.elapsed_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace detail

// Schedules one global batch (lengths in the caller's order) over dp x cp
// ranks. Empty batch -> empty plan (no micro-batches). Throws
// std::invalid_argument for bad options, a cost model it cannot use, a
// length <= 0 or above kMaxLength, or an over-length sequence under
// Overlength::kError. A cost model with comm.plan_margin above 1 decides
// with its planning_model and prices the plan with itself (hedge.hpp).
//
// `chunked`: the step's chunked documents (chunked.hpp: each one's predicted
// time and chunk passes), each assigned to a DP rank (Schedule::chunked_dp_rank;
// LPT, or round robin where that predicts faster: schedule_as_priced) and
// counted in its time with, on lockstep, the pad chunks it makes the ranks
// run; the samples' GDS balances around them (slot GDS places its slots as
// without them: on a lockstep timeline they run after every slot, whichever
// rank). Throws std::invalid_argument for a bad time or chunk count.
inline Schedule schedule(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt,
                         const ChunkedDocs& chunked = {}) {
  if (!hedged(cost)) return detail::schedule_as_priced(input, cost, opt, chunked);
  const auto start = std::chrono::steady_clock::now();
  cost.validate();  // names a bad plan_margin as itself, not as the planning model's product
  Schedule out = detail::schedule_as_priced(input, planning_model(cost), opt, chunked);
  reprice_schedule(out, cost, opt);
  out.elapsed_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace skrull
