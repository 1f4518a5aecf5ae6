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
//
//  4. The leader slot, a second candidate (leader_slot below). Equal FLOPs
//     per group is wrong where one sequence alone outlasts a group's share:
//     its slot lasts as long as it does, and step 1 gives its slot-mates an
//     average share, so they idle for most of the slot while the work they
//     could have done fills later slots. Here the longest sequence's
//     micro-batch sets the slot's time T (it alone, as DACP places it);
//     every group of that slot, its own included, is then filled longest
//     sequence first (the most FLOPs per token, so the most work off the
//     later slots), each to the group with the least time that still holds
//     it within cp * BucketSize tokens and within T as DACP places it. The
//     rest is split by steps 1-3 into the slots after it. The candidate is
//     kept when its slot time is strictly below the plain split's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/dacp_sweep.hpp"
#include "skrull/gds.hpp"
#include "skrull/types.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

// Slot and DP rank of each of the dp * c groups of a split (step 2 and 3
// above); group_us[g] its time, empty[g] whether it holds no sequence.
// rank[g] and slot[g] are -1 for empty groups left in an all-empty slot.
// `load`: each rank's time before these slots (the leader slot's), or empty
// for none. Each slot's ranks come off a min-heap on (load, rank): the least
// loaded untaken rank, ties to the lower, in O(log dp) a group. (A scan of
// every rank per group made a slot O(dp^2): 2,000 sequences at DP 23,898
// took 14 s under the fuzzer's ASan build, a slow unit it found; one
// sequence at DP 16,384 took 0.32 s.)
inline void assign_slots(const std::vector<double>& group_us, const std::vector<char>& empty, int32_t dp,
                         std::vector<int32_t>& rank, std::vector<int32_t>& slot,
                         std::vector<double> load = {}) {
  const size_t m = group_us.size();
  std::vector<int32_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (empty[a] != empty[b]) return empty[a] < empty[b];
    return group_us[a] > group_us[b];
  });
  rank.assign(m, -1);
  slot.assign(m, -1);
  load.resize(dp, 0.0);
  using Entry = std::pair<double, int32_t>;
  const auto later = std::greater<Entry>();
  std::vector<Entry> heap;
  for (size_t first = 0, s = 0; first < m && !empty[order[first]]; first += dp, ++s) {
    heap.clear();
    for (int32_t i = 0; i < dp; ++i) heap.emplace_back(load[i], i);
    std::make_heap(heap.begin(), heap.end(), later);
    const size_t end = std::min(m, first + static_cast<size_t>(dp));
    for (size_t p = first; p < end; ++p) {
      const int32_t g = order[p];
      std::pop_heap(heap.begin(), heap.end(), later);
      const int32_t best = heap.back().second;
      heap.pop_back();
      rank[g] = best;
      slot[g] = static_cast<int32_t>(s);
      load[best] += group_us[g];
    }
  }
}

// Work budget of one leader_slot call, in groups with token room visited and
// CP ranks visited: a count, not a clock, so every rank stops at the same
// point. A real batch uses a few hundred thousand (8,192 sequences at DP 128
// x CP 8: ~0.1-0.3 M); a pathological one (millions of sequences) stops
// filling there, and its slot is dropped if a group is still empty. Groups
// without room for the sequence are not counted: they are parked, not
// visited (leader_slot).
constexpr int64_t kLeaderSlotWork = int64_t{1} << 24;

// Groups each sequence tries, least time first, before the next sequence.
constexpr int32_t kLeaderSlotTries = 2;

// Whether the leader slot can pay against a plain split: its first slot's
// groups (the dp slowest) must leave room under the slowest, on average more
// than kLeaderSlotSlack of its variable part (its time less the fixed cost
// every micro-batch pays, `fixed_us`, so that cost does not decide), and the
// split must have a later slot.
constexpr double kLeaderSlotSlack = 0.05;
inline bool leader_slot_worth_trying(std::vector<double> group_us, int32_t dp, double fixed_us) {
  if (static_cast<int64_t>(group_us.size()) <= dp) return false;
  std::partial_sort(group_us.begin(), group_us.begin() + dp, group_us.end(), std::greater<double>());
  double idle = 0.0;
  for (int32_t i = 1; i < dp; ++i) idle += group_us[0] - group_us[i];
  return idle > kLeaderSlotSlack * std::max(0.0, group_us[0] - fixed_us) * (dp - 1);
}

// A lower bound on the slot time of any slot split of `seqs` over dp x cp
// ranks: each slot lasts at least its mean micro-batch, layers * a * FLOPs /
// (dp cp), plus one call's overhead and the fixed cost, and at least one
// call a layer at the host floor plus the fixed cost, and there are at least
// tokens / (dp cp BucketSize) slots. What lets schedule() skip the
// split of a leader slot's rest when it cannot win.
inline double slots_lower_bound_us(const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                                   const std::vector<int32_t>& seqs, const CostModel& cost, const Options& opt) {
  if (seqs.empty()) return 0.0;
  double f = 0.0;
  int64_t tokens = 0;
  for (int32_t k : seqs) {
    f += flops[k];
    tokens += lengths[k];
  }
  const int64_t per_slot = group_capacity(opt.bucket_size, opt.cp, opt.dp);
  const double slots = static_cast<double>((tokens + per_slot - 1) / per_slot);
  return std::max(cost.shape.layers * cost.a_us_per_flop * f / (static_cast<double>(opt.dp) * opt.cp) +
                      slots * (cost.shape.layers * cost.b_us + cost.micro_batch_fixed_us),
                  cost.floored_us(slots));
}

namespace detail {

// One group of the leader slot as it fills: per CP rank its local FLOPs and
// free tokens, the distributed share and K/V bytes, and each member's place.
// A sequence joins as the shard sweep places its rest (dacp_sweep.hpp): on
// the least-loaded rank if it has room, else the roomiest, else sharded when
// every rank has room for its shard; here also sharded when that is faster.
// O(cp) a sequence, where a DACP run per try would be O(group * cp).
// FLOPs are kept as the cost model prices the parts (refine.hpp): local[j]
// is cost.local_flops of rank j's local tokens, dist cost.dist_flops.
struct FillGroup {
  std::vector<int32_t> members, where;  // positions into `sorted`; CP rank or kDistributed
  std::vector<double> local;
  std::vector<int64_t> room, local_tokens;
  double dist = 0.0, bytes = 0.0, top = 0.0, time = 0.0;  // top: the largest local FLOPs
  double comm_t = 0.0;  // comm_us(bytes): changes only when a sequence is sharded
  int64_t tokens = 0, dist_tokens = 0, most_room = 0, least_room = 0;

  void reset(int32_t cp, int64_t bucket) {
    members.clear();
    where.clear();
    local.assign(cp, 0.0);
    room.assign(cp, bucket);
    local_tokens.assign(cp, 0);
    dist = bytes = top = time = comm_t = 0.0;
    tokens = dist_tokens = 0;
    most_room = least_room = bucket;
  }
  // micro_batch_us's time when the largest local FLOPs is top_ (the max
  // over ranks is that rank's layer call, as refine.hpp's time_with).
  double time_with(const CostModel& cost, double top_, double comm_t_, double dist_) const {
    return cost.layers_us(comm_t_, top_, dist_);
  }
  // The placement of s (f FLOPs) that keeps the time lowest, and that time;
  // false when none fits. rank: a CP rank or kDistributed.
  bool best_place(const CostModel& cost, int64_t s, double f, int32_t& rank, double& t) const {
    const int32_t cp = static_cast<int32_t>(local.size());
    if (most_room < s && (cp == 1 || least_room < shard_tokens(s, cp))) return false;  // no room, local or sharded
    bool found = false;
    int32_t r = argmin(local);
    if (room[r] < s) r = argmax(room);
    if (room[r] >= s) {
      rank = r;
      t = time_with(cost, std::max(top, cost.local_flops(local_tokens[r] + s, local[r] + f)), comm_t, dist);
      found = true;
    }
    if (cp > 1) {
      const int64_t shard = shard_tokens(s, cp);
      if (least_room >= shard) {
        const double ts = time_with(cost, top, cost.comm_us(bytes + cost.kv_bytes(shard * cp)),
                                    cost.dist_flops(dist_tokens + s, dist + f / cp, cp));
        if (!found || ts < t) {
          rank = kDistributed;
          t = ts;
          found = true;
        }
      }
    }
    return found;
  }
  void add(const CostModel& cost, int32_t pos, int64_t s, double f, int32_t rank, double t) {
    members.push_back(pos);
    where.push_back(rank);
    tokens += s;
    time = t;
    if (rank != kDistributed) {
      local[rank] = cost.local_flops(local_tokens[rank] + s, local[rank] + f);
      local_tokens[rank] += s;
      room[rank] -= s;
      top = std::max(top, local[rank]);
    } else {
      const int32_t cp = static_cast<int32_t>(local.size());
      const int64_t shard = shard_tokens(s, cp);
      for (int64_t& r : room) r -= shard;
      dist = cost.dist_flops(dist_tokens + s, dist + f / cp, cp);
      dist_tokens += s;
      bytes += cost.kv_bytes(shard * cp);
      comm_t = cost.comm_us(bytes);
    }
    most_room = *std::max_element(room.begin(), room.end());
    least_room = *std::min_element(room.begin(), room.end());
  }
};

}  // namespace detail

// The leader slot (step 4 above) over `sorted` (live sequences ascending by
// (length, index)). On success, `head` holds dp groups, group g for DP rank
// g (group 0 the leader's), members as positions into `sorted` with their
// placements (the fill's) and times (score_into's, as every micro-batch's),
// and `rest` the sequences left, ascending. DACP is not run again on the
// filled groups: no group ends above the leader's time, so a faster
// placement of one could not shorten the slot. Returns false, leaving
// nothing usable, when a group of the slot stays empty: a rank would have
// no micro-batch in slot 0.
inline bool leader_slot(const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                        const std::vector<int32_t>& sorted, const CostModel& cost, const Options& opt, Workspace& ws,
                        MicroBatchSplit& head, std::vector<int32_t>& rest) {
  const int32_t dp = opt.dp, cp = opt.cp;
  const size_t n = sorted.size();
  if (n < static_cast<size_t>(dp) || dp < 2) return false;
  const int64_t capacity = group_capacity(opt.bucket_size, cp);
  std::vector<detail::FillGroup> groups(dp);
  for (detail::FillGroup& g : groups) g.reset(cp, opt.bucket_size);
  // The leader alone, as DACP places it, sets the slot's time.
  const int32_t leader = static_cast<int32_t>(n) - 1;
  const int64_t s0 = lengths[sorted[leader]];
  const double f0 = flops[sorted[leader]];
  int32_t rb = 0, mv = 0, at = kDistributed;
  double limit = 0.0;
  if (dacp_for_into(&s0, &f0, 1, cost, opt, ws, &at, rb, mv, limit) != Status::kOk) return false;  // unreachable
  groups[0].add(cost, leader, s0, f0, at, limit);
  // The rest, longest first, each to one of the kLeaderSlotTries groups of
  // least time with token room where it keeps within the limit: a min-heap
  // on (time, group) of the groups that may have room, the ones tried set
  // aside and pushed back after it. A group found without room for s is
  // parked (a max-heap on its room) until a sequence short enough comes:
  // lengths only fall and a parked group's room does not change, so it could
  // take none before, and the heap yields the groups with room in the same
  // order as if it had stayed. Left in the heap, a full group was popped and
  // pushed back for every later sequence, and where times sit on the host
  // floor the full groups are the ones of least time, popped first (a 4 ms
  // floor, DP 128 x CP 8, 8,192 sequences: 60-200 thousand such pops a batch
  // against 5-45 thousand without a floor, the planner x1.4-2 slower;
  // docs/profile.md, "The host floor").
  // A group is parked at most once per sequence it takes, plus once:
  // O((n + dp) log dp) in all.
  using Entry = std::pair<double, int32_t>;
  const auto later = std::greater<Entry>();
  std::vector<Entry> heap, aside;
  std::vector<std::pair<int64_t, int32_t>> parked;  // (token room, group), max-heap on room
  for (int32_t g = 0; g < dp; ++g) heap.emplace_back(groups[g].time, g);
  std::make_heap(heap.begin(), heap.end(), later);
  // A group's time with a sequence of f FLOPs more is at least its compute
  // with it, local (some rank's local part reaches f) or sharded (the
  // distributed part grows by f / cp), that rank's layer call without its
  // exchange: a test in O(1). Under whole_buffer too: a part's flops() with
  // the sequence is at least its flops() without it plus the sequence's own.
  const auto at_least = [&](double top, double dist, double f) {
    const double local = cost.layer_us(0.0, std::max(top, f), dist);
    const double sharded = cost.layer_us(0.0, top, dist + f / cp);
    return cost.shape.layers * std::min(local, cp > 1 ? sharded : local) + cost.micro_batch_fixed_us;
  };
  int64_t work = 0;
  for (int32_t p = leader - 1; p >= 0 && work < kLeaderSlotWork; --p) {
    const int64_t s = lengths[sorted[p]];
    const double f = flops[sorted[p]];
    while (!parked.empty() && parked.front().first >= s) {  // room for s again
      const int32_t g = parked.front().second;
      std::pop_heap(parked.begin(), parked.end());
      parked.pop_back();
      heap.emplace_back(groups[g].time, g);
      std::push_heap(heap.begin(), heap.end(), later);
    }
    int32_t tries = 0;
    while (!heap.empty() && tries < kLeaderSlotTries) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const int32_t g = heap.back().second;
      if (groups[g].tokens + s > capacity) {
        heap.pop_back();
        parked.emplace_back(capacity - groups[g].tokens, g);
        std::push_heap(parked.begin(), parked.end());
        continue;
      }
      aside.push_back(heap.back());
      heap.pop_back();
      ++work;
      if (at_least(groups[g].top, groups[g].dist, f) > limit) continue;
      ++tries;
      int32_t rank = 0;
      double t = 0.0;
      work += cp;
      if (groups[g].best_place(cost, s, f, rank, t) && t <= limit) {
        groups[g].add(cost, p, s, f, rank, t);
        aside.back().first = t;
        break;
      }
    }
    for (const Entry& e : aside) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), later);
    }
    aside.clear();
  }
  for (const detail::FillGroup& g : groups)
    if (g.members.empty()) return false;
  // The slot as a split over `sorted` (members ascending), and what is left.
  head = MicroBatchSplit();
  head.feasible = true;
  head.m = dp;
  head.group_us.assign(dp, 0.0);
  head.rollbacks.assign(dp, 0);
  head.moves.assign(dp, 0);
  head.placement.assign(n, kDistributed);
  head.member_start.assign(dp + 1, 0);
  std::vector<char> used(n, 0);
  std::vector<int32_t> fill_rank;
  for (int32_t g = 0; g < dp; ++g) {
    detail::FillGroup& fg = groups[g];
    const size_t k = fg.members.size();
    std::vector<int32_t> idx(k);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&fg](int32_t a, int32_t b) { return fg.members[a] < fg.members[b]; });
    ws.lengths.clear();
    ws.seq_flops.clear();
    fill_rank.clear();
    for (int32_t i : idx) {
      ws.lengths.push_back(lengths[sorted[fg.members[i]]]);
      ws.seq_flops.push_back(flops[sorted[fg.members[i]]]);
      fill_rank.push_back(fg.where[i]);
      head.members.push_back(fg.members[i]);
      used[fg.members[i]] = 1;
    }
    head.member_start[g + 1] = head.member_start[g] + static_cast<int32_t>(k);
    double bytes = 0.0;
    const double t = score_into(ws.lengths.data(), ws.seq_flops.data(), fill_rank.data(), k, cost, cp, ws.tokens,
                                ws.flops, bytes);
    for (size_t q = 0; q < k; ++q) head.placement[head.members[head.member_start[g] + q]] = fill_rank[q];
    head.group_us[g] = t;
  }
  head.time_us = std::accumulate(head.group_us.begin(), head.group_us.end(), 0.0);
  head.score_us = *std::max_element(head.group_us.begin(), head.group_us.end());
  rest.clear();
  for (size_t p = 0; p < n; ++p)
    if (!used[p]) rest.push_back(sorted[p]);
  return true;
}

}  // namespace skrull
