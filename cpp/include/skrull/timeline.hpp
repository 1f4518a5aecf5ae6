// Step time of a plan on the timeline the trainer executes
// (docs/design/cost_model.md, "Timelines"). The one function the scheduler,
// the simulator, the step log and the lower bound share.
//
// A plan's micro-batches stand in slots: slot j of a DP rank (CP group) is
// its j-th micro-batch. The timelines differ in what waits for what:
//
//   lockstep:     FSDP gathers each layer's parameters, per micro-batch, over
//                 the whole shard mesh (every DP and CP rank), so all ranks
//                 run slot j together and a rank without a j-th micro-batch
//                 runs a pad pass (pad_us: CostModel::pad_pass_us, one local
//                 token a CP rank through every layer and the head, so every
//                 layer call's intercept or host floor and the fixed cost):
//                 step = sum over slots of the slowest rank in the slot.
//   free-running: ranks share no collective until the step's gradient
//                 reduction: step = the slowest rank's micro-batches back to
//                 back (the paper's timeline). At DP > 1 a rank with no
//                 micro-batch still runs one pad pass (pad_us), where the
//                 step runs anything: FSDP's first all-gathers and the one
//                 gradient reduce-scatter need a pass on every rank
//                 (data/steps/plan_buffers.py rank_buffers).
//
// Both add step_us once (CostModel::step_fixed_us: what a step pays whatever
// its micro-batches) to a step that runs any micro-batch.
//
// after_us (optional, per DP rank): work a rank runs after its micro-batches
// on its whole CP group, outside the slots: its chunked documents
// (overlength "chunk", chunked.hpp). Free-running, it lengthens that rank's
// sum; lockstep, the slots end together and the step waits for the rank
// with the most.
//
// Units: microseconds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "skrull/types.hpp"

namespace skrull {

// rank_us[i][j]: time of DP rank i's j-th micro-batch. A rank with fewer
// micro-batches than the longest list pads the missing slots (lockstep).
// Whether any rank has work after its micro-batches (after_us above).
inline bool any_after(const std::vector<double>* after_us) {
  if (after_us == nullptr) return false;
  for (double t : *after_us)
    if (t > 0.0) return true;
  return false;
}

// Free-running at DP > 1 (dp ranks), in a step that runs anything: whether
// a rank with no micro-batch runs its one pad pass (file comment).
inline bool idle_pad(Timeline timeline, size_t dp, bool runs) {
  return timeline == Timeline::kFreeRunning && dp > 1 && runs;
}

// Adds that pad pass to rank_time_us[i] (each rank's time, its micro-batches
// and after_us summed) of every rank i with no micro-batch in rank_us.
inline void add_idle_pads(std::vector<double>& rank_time_us, const std::vector<std::vector<double>>& rank_us,
                          Timeline timeline, double pad_us, const std::vector<double>* after_us) {
  bool runs = any_after(after_us);
  for (const auto& rank : rank_us) runs = runs || !rank.empty();
  if (!idle_pad(timeline, rank_us.size(), runs)) return;
  for (size_t i = 0; i < rank_us.size(); ++i)
    if (rank_us[i].empty()) rank_time_us[i] += pad_us;
}

inline double step_time_us(const std::vector<std::vector<double>>& rank_us, Timeline timeline, double pad_us,
                           double step_us = 0.0, const std::vector<double>* after_us = nullptr) {
  double out = 0.0;
  size_t slots = 0;
  for (const auto& rank : rank_us) slots = std::max(slots, rank.size());
  const bool after = any_after(after_us);
  if (slots == 0 && !after) return 0.0;
  if (timeline == Timeline::kFreeRunning) {
    const bool pads = idle_pad(timeline, rank_us.size(), true);
    for (size_t i = 0; i < rank_us.size(); ++i) {
      double sum = 0.0;
      for (double t : rank_us[i]) sum += t;
      if (after) sum += (*after_us)[i];  // after its micro-batches, in that order (as dp_time_us sums it)
      if (pads && rank_us[i].empty()) sum += pad_us;
      out = std::max(out, sum);
    }
    return out + step_us;
  }
  for (size_t j = 0; j < slots; ++j) {
    double slot = 0.0;
    for (const auto& rank : rank_us) slot = std::max(slot, j < rank.size() ? rank[j] : pad_us);
    out += slot;
  }
  if (after) out += *std::max_element(after_us->begin(), after_us->end());
  return out + step_us;
}

// A pool plan's micro-batches (pool.hpp): each on a block of `groups` CP
// groups from `first_group`, at `slot`. Lockstep: the sum over slots of the
// slowest micro-batch in it (pad_us where a group idles). Free-running: in
// (slot, first group) order each starts when all its groups are free; the
// last group to finish, a group without a micro-batch after its pad pass
// (idle_pad). start_us, when given, receives each one's start;
// after_us as step_time_us's (group_free_us then includes it).
struct SlotTime {
  int32_t slot, first_group, groups;
  double time_us;
};

inline double plan_step_time_us(const std::vector<SlotTime>& mbs, int32_t dp, Timeline timeline, double pad_us,
                                std::vector<double>* group_free_us = nullptr, std::vector<double>* start_us = nullptr,
                                double step_us = 0.0, const std::vector<double>* after_us = nullptr) {
  std::vector<size_t> order(mbs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&mbs](size_t a, size_t b) {
    return mbs[a].slot != mbs[b].slot ? mbs[a].slot < mbs[b].slot : mbs[a].first_group < mbs[b].first_group;
  });
  if (start_us) start_us->assign(mbs.size(), 0.0);
  std::vector<double> clock(dp, 0.0);
  std::vector<char> used(dp, 0);
  double lockstep = 0.0;
  for (size_t p = 0; p < order.size();) {
    const int32_t slot = mbs[order[p]].slot;
    double slowest = 0.0;
    int32_t busy = 0;
    for (; p < order.size() && mbs[order[p]].slot == slot; ++p) {
      const SlotTime& mb = mbs[order[p]];
      const auto first = clock.begin() + mb.first_group;
      const double start = *std::max_element(first, first + mb.groups);
      if (start_us) (*start_us)[order[p]] = timeline == Timeline::kLockstep ? lockstep : start;
      std::fill(first, first + mb.groups, start + mb.time_us);
      std::fill(used.begin() + mb.first_group, used.begin() + mb.first_group + mb.groups, 1);
      slowest = std::max(slowest, mb.time_us);
      busy += mb.groups;
    }
    if (busy < dp) slowest = std::max(slowest, pad_us);
    lockstep += slowest;
  }
  const bool after = any_after(after_us);
  if (after) {
    for (int32_t g = 0; g < dp; ++g) clock[g] += (*after_us)[g];
    lockstep += *std::max_element(after_us->begin(), after_us->end());
  }
  if (idle_pad(timeline, static_cast<size_t>(dp), !mbs.empty() || after))
    for (int32_t g = 0; g < dp; ++g)
      if (!used[g]) clock[g] += pad_us;
  if (group_free_us) *group_free_us = clock;
  const double once = mbs.empty() && !after ? 0.0 : step_us;
  if (timeline == Timeline::kLockstep) return lockstep + once;
  return (clock.empty() ? 0.0 : *std::max_element(clock.begin(), clock.end())) + once;
}

}  // namespace skrull
