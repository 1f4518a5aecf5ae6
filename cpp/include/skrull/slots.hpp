// Slot GDS: the global batch split for a lockstep timeline (timeline.hpp),
// where every DP rank runs micro-batch slot j at the same time and a slot
// lasts as long as its slowest micro-batch (docs/design/algorithms.md,
// "Slot GDS").
//
// The paper's GDS balances each DP rank's *sum*; on a lockstep timeline
// that leaves slot j pairing one rank's long micro-batch with another's
// short one (or a pad pass). Here the micro-batches are formed for the
// whole global batch at once, then grouped into slots of similar cost:
//
//  1. All sequences are split into c * dp groups by LPT on FLOPs (longest
//     first, each to the group with the least FLOPs that has room for it,
//     at most cp * BucketSize tokens a group), each placed by DACP. Equal
//     FLOPs per group is what makes every slot balanced; the strided split
//     of Algorithm 2 balances tokens, and with quadratic attention a group
//     holding a long sequence then takes far longer than its slot-mates.
//     The count c is searched as per rank (split_micro_batches with unit =
//     dp): the smallest feasible one, then (kPredictedTime) the next counts
//     scored by their slot time.
//  2. Groups sorted by predicted time, descending (empty groups last, ties
//     by group index), and cut into consecutive runs of dp: run s is slot s.
//     For given micro-batch times this grouping minimises the sum of the
//     slot maxima.
//  3. Within a slot, the groups go slowest first to the DP rank with the
//     least time so far (ties to the lower rank): the plan stays balanced
//     per rank too, so it is good on a free-running timeline as well.
//
// Empty groups sort last, so a rank's micro-batches fill its first slots
// and its pad passes come after them; a slot of empty groups only is dropped.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace skrull {

// Slot and DP rank of each of the dp * c groups of a split (step 2 and 3
// above); group_us[g] its time, empty[g] whether it holds no sequence.
// rank[g] and slot[g] are -1 for empty groups left in an all-empty slot.
inline void assign_slots(const std::vector<double>& group_us, const std::vector<char>& empty, int32_t dp,
                         std::vector<int32_t>& rank, std::vector<int32_t>& slot) {
  const size_t m = group_us.size();
  std::vector<int32_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (empty[a] != empty[b]) return empty[a] < empty[b];
    return group_us[a] > group_us[b];
  });
  rank.assign(m, -1);
  slot.assign(m, -1);
  std::vector<double> load(dp, 0.0);
  std::vector<char> taken(dp, 0);
  for (size_t first = 0, s = 0; first < m && !empty[order[first]]; first += dp, ++s) {
    std::fill(taken.begin(), taken.end(), 0);
    const size_t end = std::min(m, first + static_cast<size_t>(dp));
    for (size_t p = first; p < end; ++p) {
      const int32_t g = order[p];
      int32_t best = -1;
      for (int32_t i = 0; i < dp; ++i)
        if (!taken[i] && (best < 0 || load[i] < load[best])) best = i;
      taken[best] = 1;
      rank[g] = best;
      slot[g] = static_cast<int32_t>(s);
      load[best] += group_us[g];
    }
  }
}

}  // namespace skrull
