// GDS (docs/design/algorithms.md, Algorithm 2 with its loop fixed): split a
// global batch over DP ranks, then each rank's share into micro-batches that
// DACP can schedule within memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <utility>
#include <vector>

#include "skrull/chunked.hpp"
#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/dacp_sweep.hpp"
#include "skrull/types.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

namespace detail {

// Sorts indices (given ascending) by length descending, ties by index
// ascending: a stable LSD radix sort on (longest - length), one byte a
// pass, as many passes as the spread of lengths needs (3 for real
// batches). No data-dependent branches, where a comparison sort of a
// global batch mispredicted its way to a tenth of the schedule's time.
inline void sort_descending_by_length(const std::vector<int64_t>& lengths, std::vector<int32_t>& idx,
                                      std::vector<int32_t>& scratch) {
  if (idx.size() < 2) return;
  int64_t longest = 0, shortest = kMaxLength;
  for (int32_t k : idx) {
    longest = std::max(longest, lengths[k]);
    shortest = std::min(shortest, lengths[k]);
  }
  scratch.resize(idx.size());
  for (int shift = 0; (longest - shortest) >> shift != 0; shift += 8) {
    size_t count[257] = {};
    for (int32_t k : idx) ++count[((longest - lengths[k]) >> shift & 0xFF) + 1];
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (int32_t k : idx) scratch[count[(longest - lengths[k]) >> shift & 0xFF]++] = k;
    idx.swap(scratch);
  }
}

// `share` is in split_over_dp's order, descending (length, index ascending
// among equals); writes it ascending (length, index), the order GDS and
// Algorithm 1 take: the reverse, each run of equal lengths put back in index
// order. O(n) where a sort would be O(n log n).
inline void reverse_to_ascending(const std::vector<int64_t>& lengths, const std::vector<int32_t>& share,
                                 std::vector<int32_t>& out) {
  out.assign(share.rbegin(), share.rend());
  for (size_t p = 0; p < out.size();) {
    size_t q = p + 1;
    while (q < out.size() && lengths[out[q]] == lengths[out[p]]) ++q;
    std::reverse(out.begin() + p, out.begin() + q);
    p = q;
  }
}

// LPT's assignment: each of `order` in turn goes to the bin with the least
// load so far (ties to the lower bin), whose load then grows by weight[k].
// `load` holds each bin's load before the first (0 for an empty bin).
// Returns each bin's members in the order given. split_over_dp and the
// pool's shares (pool.hpp, on top of its wide work) both assign this way.
inline std::vector<std::vector<int32_t>> lpt_bins(const std::vector<int32_t>& order, const std::vector<double>& weight,
                                                  std::vector<double> load) {
  const int32_t bins_n = static_cast<int32_t>(load.size());
  std::vector<std::vector<int32_t>> bins(bins_n);
  for (auto& bin : bins) bin.reserve(order.size() / bins_n + 1);
  if (bins_n <= 32) {  // a scan beats a heap for few bins; both pick the same bin
    for (int32_t k : order) {
      const int32_t t = argmin(load);
      bins[t].push_back(k);
      load[t] += weight[k];
    }
    return bins;
  }
  // Min-heap on (load, bin): the least-loaded bin, ties to the lower one.
  using Entry = std::pair<double, int32_t>;
  std::vector<Entry> heap_storage;
  heap_storage.reserve(bins_n);
  for (int32_t i = 0; i < bins_n; ++i) heap_storage.emplace_back(load[i], i);
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(std::greater<Entry>(),
                                                                           std::move(heap_storage));
  for (int32_t k : order) {
    auto [l, t] = heap.top();
    heap.pop();
    bins[t].push_back(k);
    heap.emplace(l + weight[k], t);
  }
  return bins;
}

}  // namespace detail

// Longest-processing-time greedy by FLOPs: sequences by length descending
// (FLOPs grow with length; ties by index) each go to the DP rank with the
// least FLOPs so far (ties to the lower rank). Returns each rank's share,
// in that order (descending). flops[k] = cost.flops(lengths[k]).
// `initial` (dp entries, or empty for none): each rank's load before the
// first sequence, in the same unit (its chunked documents, chunked.hpp).
inline std::vector<std::vector<int32_t>> split_over_dp(const std::vector<int64_t>& lengths,
                                                       const std::vector<double>& flops,
                                                       const std::vector<int32_t>& live, int32_t dp,
                                                       const std::vector<double>& initial = {}) {
  std::vector<int32_t> order = live;
  std::vector<int32_t> scratch;
  detail::sort_descending_by_length(lengths, order, scratch);
  return detail::lpt_bins(order, flops, initial.empty() ? std::vector<double>(dp, 0.0) : initial);
}

// Each chunked document's DP rank (chunked.hpp): LPT by time, longest first (ties by
// index), each to the rank with the least so far (ties to the lower rank), given their times.
inline std::vector<int32_t> assign_chunked(const std::vector<double>& chunked_us, int32_t dp) {
  validate_chunked(chunked_us);
  std::vector<int32_t> order(chunked_us.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return chunked_us[a] > chunked_us[b]; });
  const auto bins = detail::lpt_bins(order, chunked_us, std::vector<double>(dp, 0.0));
  std::vector<int32_t> out(chunked_us.size(), 0);
  for (int32_t i = 0; i < dp; ++i)
    for (int32_t k : bins[i]) out[k] = i;
  return out;
}

// How a split forms its m groups from sequences sorted ascending.
enum class Grouping : int32_t {
  kStrided = 0,  // group j = sorted[j::m]: pairs long with short (Algorithm 2)
  kLpt = 1,      // longest first, each to the group with the least FLOPs that has room (slots.hpp)
};

// One candidate split of a DP rank's (ascending) share into m micro-batches.
// Group j holds the positions members[member_start[j] .. member_start[j+1])
// of `sorted`, ascending; placement[p] places sorted[p].
struct MicroBatchSplit {
  bool feasible = false;
  int32_t m = 0;
  double time_us = 0.0;           // sum of the groups' times
  double score_us = 0.0;          // what the count search minimises: time_us, or the slot time (unit > 1)
  std::vector<double> group_us;   // per group (0 for an empty one)
  std::vector<int32_t> member_start, members;
  std::vector<int32_t> placement;
  std::vector<int32_t> rollbacks;  // per group
  std::vector<int32_t> moves;      // per group
  int32_t tries = 0;               // splits split_micro_batches tried
};

namespace detail {

// Groups of a split as member lists; false when kLpt finds no group with
// room for a sequence (each group holds at most `capacity` tokens).
inline bool form_groups(const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                        const std::vector<int32_t>& sorted, int32_t m, Grouping grouping, int64_t capacity,
                        MicroBatchSplit& out) {
  const size_t n = sorted.size();
  out.member_start.assign(m + 1, 0);
  out.members.resize(n);
  if (grouping == Grouping::kStrided) {
    for (int32_t j = 0, q = 0; j < m; ++j) {
      out.member_start[j] = q;
      for (size_t i = j; i < n; i += m) out.members[q++] = static_cast<int32_t>(i);
    }
    out.member_start[m] = static_cast<int32_t>(n);
    return true;
  }
  // kLpt: positions longest first, each to the least-loaded group with room
  // (ties to the lower group): a min-heap on (load, group). A group without
  // room for this sequence is parked in a max-heap on its room and comes
  // back once the sequences (longest first, so never longer) fit it again.
  // A group is parked again only after it took a sequence, so every group
  // is parked at most once per sequence it takes plus once: O((n + m) log m).
  // (Setting the full groups aside for one sequence and pushing them all
  // back after it was O(n m log m) once groups filled: at DP 128 x CP 8,
  // 65,536 sequences, a lockstep plan took 5.7 s.)
  std::vector<int32_t> group(n);
  std::vector<int64_t> room(m, capacity);
  using Entry = std::pair<double, int32_t>;
  std::vector<Entry> heap;
  heap.reserve(m);
  for (int32_t j = 0; j < m; ++j) heap.emplace_back(0.0, j);  // already a min-heap
  std::vector<std::pair<int64_t, Entry>> parked;  // (room, its heap entry), a max-heap on room
  const auto later = std::greater<Entry>();
  const auto less_room = [](const std::pair<int64_t, Entry>& a, const std::pair<int64_t, Entry>& b) {
    return a.first < b.first;
  };
  for (size_t q = n; q-- > 0;) {
    const int64_t s = lengths[sorted[q]];
    while (!parked.empty() && parked.front().first >= s) {
      std::pop_heap(parked.begin(), parked.end(), less_room);
      heap.push_back(parked.back().second);
      std::push_heap(heap.begin(), heap.end(), later);
      parked.pop_back();
    }
    while (!heap.empty() && room[heap.front().second] < s) {
      std::pop_heap(heap.begin(), heap.end(), later);
      parked.emplace_back(room[heap.back().second], heap.back());
      std::push_heap(parked.begin(), parked.end(), less_room);
      heap.pop_back();
    }
    if (heap.empty()) return false;
    std::pop_heap(heap.begin(), heap.end(), later);
    auto [load, best] = heap.back();
    heap.pop_back();
    group[q] = best;
    room[best] -= s;
    heap.emplace_back(load + flops[sorted[q]], best);
    std::push_heap(heap.begin(), heap.end(), later);
  }
  for (size_t q = 0; q < n; ++q) ++out.member_start[group[q] + 1];
  for (int32_t j = 0; j < m; ++j) out.member_start[j + 1] += out.member_start[j];
  std::vector<int32_t> fill(out.member_start.begin(), out.member_start.end() - 1);
  for (size_t q = 0; q < n; ++q) out.members[fill[group[q]]++] = static_cast<int32_t>(q);
  return true;
}

}  // namespace detail

// Splits into m groups (`grouping`). Infeasible when a group holds more
// than cp * bucket tokens or no DACP placement (dacp_into, and the shard
// sweep when the options ask for it) fits it. An empty group (m above the
// number of sequences) is a pad pass with no time of its own.
//
// `give_up_above`: a split whose groups sum to more than this is of no use
// to the caller, which keeps a faster one. Before placing each group the
// time so far plus the lower bounds of the groups left is checked against
// it, and the split is abandoned (infeasible) once that passes it: most
// extra micro-batch counts lose, and this stops them after a few groups.
inline void split_groups(const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                         const std::vector<int32_t>& sorted, int32_t m, Grouping grouping,
                         const CostModel& cost, const Options& opt, Workspace& ws, MicroBatchSplit& out,
                         double give_up_above = std::numeric_limits<double>::infinity()) {
  out.feasible = false;
  out.m = m;
  out.time_us = 0.0;
  out.group_us.assign(m, 0.0);
  out.placement.assign(sorted.size(), kDistributed);
  out.rollbacks.assign(m, 0);
  out.moves.assign(m, 0);
  const int64_t capacity = group_capacity(opt.bucket_size, opt.cp);
  if (!detail::form_groups(lengths, flops, sorted, m, grouping, capacity, out)) return;
  const auto gather = [&](int32_t j) {
    ws.lengths.clear();
    ws.seq_flops.clear();
    for (int32_t q = out.member_start[j]; q < out.member_start[j + 1]; ++q) {
      ws.lengths.push_back(lengths[sorted[out.members[q]]]);
      ws.seq_flops.push_back(flops[sorted[out.members[q]]]);
    }
  };
  for (int32_t j = 0; j < m; ++j) {
    int64_t tokens = 0;
    for (int32_t q = out.member_start[j]; q < out.member_start[j + 1]; ++q) tokens += lengths[sorted[out.members[q]]];
    if (tokens > capacity) return;
  }
  const bool bounded = give_up_above < std::numeric_limits<double>::infinity();
  std::vector<double>& left = ws.group_bounds;  // lower bounds of groups j..m-1
  left.assign(m + 1, 0.0);
  for (int32_t j = m; bounded && j-- > 0;) {
    gather(j);
    left[j] = left[j + 1] +
              cost.micro_batch_lower_bound_us(ws.lengths.data(), ws.lengths.size(), opt.cp, ws.seq_flops.data());
  }
  for (int32_t j = 0; j < m; ++j) {
    if (bounded && out.time_us + left[j] > give_up_above * (1.0 + detail::kSweepBoundSlack)) return;
    gather(j);
    const size_t g = ws.lengths.size();
    if (g == 0) continue;
    ws.placement.resize(g);
    double time = 0.0;
    if (dacp_for_into(ws.lengths.data(), ws.seq_flops.data(), g, cost, opt, ws, ws.placement.data(),
                      out.rollbacks[j], out.moves[j], time) != Status::kOk)
      return;
    out.time_us += time;
    out.group_us[j] = time;
    for (int32_t q = out.member_start[j], i = 0; q < out.member_start[j + 1]; ++q, ++i)
      out.placement[out.members[q]] = ws.placement[i];
  }
  out.feasible = true;
  out.score_us = out.time_us;
}

// Slot time of a split whose m = c * unit groups run as c slots of `unit`
// micro-batches each, the slowest `unit` together (slots.hpp): the groups'
// times sorted descending, the first of every `unit` summed. For given
// group times no other grouping into slots is faster.
inline double slot_score_us(std::vector<double> group_us, int32_t unit) {
  std::sort(group_us.begin(), group_us.end(), std::greater<double>());
  double out = 0.0;
  for (size_t j = 0; j < group_us.size(); j += unit) out += group_us[j];
  return out;
}

// Counts tried one by one before split_micro_batches gallops.
constexpr int32_t kLinearCounts = 8;

// Micro-batches of one DP rank, `share` sorted ascending (length, index):
// the smallest feasible count m, or (MicroBatchCount::kPredictedTime) the
// feasible count among the smallest and the next max_extra_micro_batches
// with the least predicted time, ties to fewer micro-batches. Counts whose
// lower bound, layers * (a * FLOPs / cp + m * b) + m * fixed, already reaches the best
// time are not tried: the bound only grows with m.
//
// Bounded search. A single sequence per micro-batch is always feasible for
// schedulable lengths, so m = n (the number of sequences) is. Counts from
// the token lower bound m0 are tried one by one, kLinearCounts of them;
// past that the step doubles up to n, and the gap between the last
// infeasible and the first feasible count is bisected. At most
// kLinearCounts + 2 ceil(log2 n) + max_extra_micro_batches splits, each
// O(n (cp + log n)), whatever the lengths. The count found is the smallest
// feasible one whenever that is within kLinearCounts of m0 (as for real
// batches); else it is a feasible count just above an infeasible one.
// (Trying every count, one giant sequence among 50,000 tiny ones, feasible
// only at m = n, took 50,000 splits: 1.4 s.)
//
// `unit` > 1 (slot GDS, slots.hpp, with Grouping::kLpt): the counts are
// multiples of unit (a count c means c * unit groups, c slots over unit DP
// ranks, groups beyond the number of sequences empty), and a split's score
// is its slot time (slot_score_us), which the predicted-time step
// minimises. unit = 1 is the per-rank search above, its score the sum of
// its groups' times.
inline MicroBatchSplit split_micro_batches(const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                                           const std::vector<int32_t>& share, const CostModel& cost,
                                           const Options& opt, Workspace& ws, int32_t unit = 1,
                                           Grouping grouping = Grouping::kStrided) {
  MicroBatchSplit best, cand;
  if (share.empty()) {
    best.feasible = true;  // zero micro-batches
    return best;
  }
  int64_t tokens = 0;
  double total_flops = 0.0;
  for (int32_t k : share) {
    tokens += lengths[k];
    total_flops += flops[k];
  }
  const int64_t capacity = group_capacity(opt.bucket_size, opt.cp, unit);
  // Counts c: c * unit groups. The largest needed holds one sequence per group.
  const int32_t n = static_cast<int32_t>((static_cast<int64_t>(share.size()) + unit - 1) / unit);
  const int32_t m0 = static_cast<int32_t>(std::min<int64_t>(n, std::max<int64_t>(1, (tokens + capacity - 1) / capacity)));
  int32_t tries = 0;
  auto score = [unit](MicroBatchSplit& s) {
    if (unit > 1) s.score_us = slot_score_us(s.group_us, unit);
  };
  auto try_split = [&](int32_t m) {
    ++tries;
    split_groups(lengths, flops, share, m * unit, grouping, cost, opt, ws, cand);
    if (!cand.feasible) return false;
    score(cand);
    std::swap(best, cand);
    return true;
  };
  // 1. The first feasible count: one by one, then galloping, then bisection.
  const int32_t linear_end = static_cast<int32_t>(std::min<int64_t>(n, int64_t{m0} + kLinearCounts - 1));
  int32_t lo = m0 - 1;  // highest count known infeasible
  for (int32_t m = m0; m <= linear_end && !try_split(m); ++m) lo = m;
  for (int64_t step = 2; !best.feasible; step *= 2) {
    if (lo >= n) return best;  // unreachable (m = n is feasible); the caller throws
    const int32_t hi = static_cast<int32_t>(std::min<int64_t>(n, lo + step));
    if (!try_split(hi)) lo = hi;
  }
  while (best.m / unit - lo > 1) {
    const int32_t mid = lo + (best.m / unit - lo) / 2;
    if (!try_split(mid)) lo = mid;
  }
  // 2. kPredictedTime: the next counts, if their bound can still win. The
  // bound is on the sum of the groups' times (non-empty groups pay b and the
  // fixed cost each, and at least one call a layer at the host floor); a
  // slot time is at least that sum over unit.
  if (opt.micro_batch_count == MicroBatchCount::kPredictedTime) {
    const int32_t last = static_cast<int32_t>(std::min<int64_t>(n, static_cast<int64_t>(best.m / unit) + opt.max_extra_micro_batches));
    const int64_t live = static_cast<int64_t>(share.size());
    for (int32_t c = best.m / unit + 1; c <= last; ++c) {
      const double groups = static_cast<double>(std::min<int64_t>(live, static_cast<int64_t>(c) * unit));
      const double line = (cost.shape.layers * (cost.a_us_per_flop * total_flops / opt.cp + groups * cost.b_us) +
                            groups * cost.micro_batch_fixed_us) / unit;
      const double bound = std::max(line, cost.floored_us(groups) / unit);
      if (bound >= best.score_us) break;
      ++tries;
      split_groups(lengths, flops, share, c * unit, grouping, cost, opt, ws, cand, best.score_us * unit);
      if (!cand.feasible) continue;
      score(cand);
      if (cand.score_us < best.score_us) std::swap(best, cand);
    }
  }
  best.tries = tries;
  return best;
}

}  // namespace skrull
