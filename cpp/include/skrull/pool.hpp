// One pool: each sequence sharded over as many ranks as it needs,
// anywhere in the DP x CP world, as policy "skrull-pool".
//
// A rank set is a contiguous run of global ranks (global rank = dp_rank * cp
// + cp_rank): one rank (local), an aligned sub-block of one CP group (k a
// power of two, 2 <= k < cp, at a multiple of k inside the group), one whole
// CP group (distributed, as skrull), or a block of CP groups, 2^a groups
// aligned at a multiple of 2^a, or all dp groups. Blocks of whole groups
// keep every wide exchange on whole nodes; sub-group sets appear only in
// one-group micro-batches, by step 4, where they predict the micro-batch
// strictly faster (docs/design/algorithms.md, "skrull-pool").
//
// Plan, a pure function of (lengths, cost model, options):
//  1. "Wide" sequences: longer than a CP group can hold, or whose time
//     sharded over their own group alone exceeds pool_widen x the ideal
//     time of a group (all the batch's work spread over every rank): that
//     group would be the straggler whatever else it ran. Each gets the
//     fewest groups that hold it and bring its time within that target
//     (else the fastest span), and a micro-batch of its own on a block,
//     list-scheduled longest first onto the block whose groups free up
//     first.
//  2. The rest go over the groups by LPT on top of the wide work, and each
//     group's share is split into micro-batches by skrull's GDS + DACP
//     (detail::split_share, the same options).
//  3. When every sequence fits a CP group, skrull's own plan (schedule()) is
//     the other candidate, and it wins unless the pool's predicts the step
//     shorter by more than kPoolMinGain: the pool plan is never predicted
//     slower than skrull's.
//  4. Sub-group sets, in every one-group micro-batch of the plan kept: each
//     sequence sharded over the whole group, longest first, moves to the
//     aligned block of k < cp ranks that fits in memory and predicts the
//     micro-batch fastest, if strictly faster than the whole group
//     (pool_narrow). Narrowing helps where the exchange weighs: a k-rank
//     exchange moves less per rank, and the ranks outside the block drop
//     it and its compute. Kept only where the step needs it: the narrowed
//     plan only if its step is strictly shorter, then each micro-batch set
//     back whose narrowing the step does not need (narrow_for_the_step). A
//     faster micro-batch off the step's critical path is no gain, and its
//     price rests on assumptions a different model may not share; so step
//     3's promise holds per step, never per micro-batch.
//
// Time: on the job's timeline (timeline.hpp). Free-running, every group
// runs its micro-batches in slot order and a micro-batch on a block starts
// when all its groups are free; lockstep, each slot lasts as long as its
// slowest micro-batch. Its time is the overlap
// formula over its ranks; an exchange over k ranks moves the K/V bytes
// scaled to the ring's per-rank share, (k-1)/k, against the group's,
// (cp-1)/cp, where the comm table was measured, and pays
// the cost model's comm.cross_group_factor when it leaves a group. With sub-group sets a
// rank's exchange is that of the sharded sequences it holds: per rank,
// max(T_comm(its bytes), T_comp(local)) + T_comp(its shards), which is
// skrull's formula when every set is the whole group.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/gds.hpp"
#include "skrull/hedge.hpp"
#include "skrull/plan.hpp"
#include "skrull/scheduler.hpp"
#include "skrull/timeline.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

// A departure from skrull's plan (the pool's own plan in step 3, sub-group
// sets in step 4) is kept only when it predicts the step shorter by more
// than this fraction of it. Smaller gains are within what the pool's own
// pricing assumptions (a narrower ring's share of the bytes, the cross-group
// factor) can get wrong: scored on a model with other coefficients, plans
// that gained 0.03-0.2% here came out up to 0.3% slower than skrull's
// (docs/design/cost_model.md, "skrull-pool against skrull").
constexpr double kPoolMinGain = 0.01;

namespace detail {

// A k-rank ring exchange moves (k-1)/k of the K/V bytes per rank; the comm
// table was measured on a CP group, (cp-1)/cp. Their ratio scales the bytes
// of a k-rank exchange into the table's unit (1 at k == cp).
inline double pool_ring_share(int32_t k, int32_t cp) {
  const double ref = std::max(cp, 2);
  return ((k - 1.0) / k) / ((ref - 1.0) / ref);
}

// Communication time of one layer for a sequence of s tokens sharded over
// `groups` whole CP groups (k = groups * cp ranks). groups == 1 is skrull's
// price exactly.
inline double pool_comm_us(const CostModel& cost, int64_t s, int32_t groups, int32_t cp, double cross) {
  const int32_t k = groups * cp;
  const double bytes = cost.kv_bytes(shard_tokens(s, k) * static_cast<int64_t>(k));
  if (groups == 1) return cost.comm_us(bytes);
  return cross * cost.comm_us(bytes * pool_ring_share(k, cp));
}

// K/V bytes of one layer of a sequence of s tokens sharded over k ranks
// inside one CP group, in the comm table's unit: the real bytes scaled by
// pool_ring_share (no cross-group factor: the exchange stays in the group).
// k == cp is skrull's figure exactly.
inline double pool_group_bytes(const CostModel& cost, int64_t s, int32_t k, int32_t cp) {
  const double bytes = cost.kv_bytes(shard_tokens(s, k) * static_cast<int64_t>(k));
  return k == cp ? bytes : bytes * pool_ring_share(k, cp);
}

// A wide micro-batch: one sequence alone over k ranks.
inline double pool_wide_us(const CostModel& cost, int64_t s, double f, int32_t groups, int32_t cp, double cross) {
  return cost.shape.layers * cost.layer_us(pool_comm_us(cost, s, groups, cp, cross), 0.0, f / (groups * cp));
}

// Spans a wide sequence may take, in groups: powers of two up to dp, and dp.
inline std::vector<int32_t> pool_spans(int32_t dp) {
  std::vector<int32_t> out;
  for (int32_t g = 2; g <= dp; g *= 2) out.push_back(g);
  if (dp > 1 && out.back() != dp) out.push_back(dp);
  return out;
}

// Scratch of pool_narrow, reused over a plan's micro-batches. Per CP rank
// of the group: local FLOPs, distributed FLOPs, exchange bytes (the comm
// table's unit), tokens and the number of sharded sets holding it; the
// time of ranks outside a candidate block (filled on demand).
struct NarrowScratch {
  std::vector<double> local, dist, bytes, rest_us;
  std::vector<int64_t> tokens;
  std::vector<int32_t> sets, order, first_rank, num_ranks;
  std::vector<char> rest_known;
};

// Adds (sign 1) or removes (sign -1) one sharded sequence of s tokens and f
// FLOPs on ranks [first, first + k) of the group. A rank left with no
// sharded set gets exactly zero distributed FLOPs and bytes (no rounding
// residue that would charge it a call's overhead).
inline void pool_group_move(NarrowScratch& w, const CostModel& cost, int32_t cp, int64_t s, double f, int32_t first,
                            int32_t k, int sign) {
  const int64_t shard = shard_tokens(s, k);
  const double share = f / k, b = pool_group_bytes(cost, s, k, cp);
  for (int32_t j = first; j < first + k; ++j) {
    w.sets[j] += sign;
    w.tokens[j] += sign * shard;
    w.dist[j] = w.sets[j] == 0 ? 0.0 : w.dist[j] + sign * share;
    w.bytes[j] = w.sets[j] == 0 ? 0.0 : w.bytes[j] + sign * b;
  }
}

// Per-rank sums of a one-group micro-batch, every sequence on its current
// rank set, added in micro-batch order.
inline void pool_group_sums(const PlanMicroBatch& mb, const std::vector<int64_t>& lengths,
                            const std::vector<double>& flops, const CostModel& cost, int32_t cp, NarrowScratch& w) {
  const int32_t base = mb.first_group * cp;
  w.local.assign(cp, 0.0);
  w.dist.assign(cp, 0.0);
  w.bytes.assign(cp, 0.0);
  w.tokens.assign(cp, 0);
  w.sets.assign(cp, 0);
  for (size_t q = 0; q < mb.seqs.size(); ++q) {
    const int32_t seq = mb.seqs[q], k = mb.num_ranks[q], first = mb.first_rank[q] - base;
    if (k == 1) {
      w.local[first] += flops[seq];
      w.tokens[first] += lengths[seq];
    } else {
      pool_group_move(w, cost, cp, lengths[seq], flops[seq], first, k, 1);
    }
  }
}

// One rank's time of one layer under the overlap formula, with its own
// exchange: max(floor, max(T_comm(its sharded sequences' bytes),
// line(local)) + line(its shares of them)) (cost_model.hpp layer_us). With
// every sharded sequence on the whole group this is skrull's micro_batch_us
// per rank.
inline double pool_rank_us(const CostModel& cost, double local, double dist, double bytes) {
  return cost.layer_us(cost.comm_us(bytes), local, dist);
}

// Sub-group sets: in a one-group micro-batch, narrows each sequence sharded
// over the whole group, longest first (ties by position), to the aligned
// block of k ranks (k a power of two, 2 <= k < cp, first rank a multiple of
// k) that keeps every rank within `bucket` and gives the lowest predicted
// time, if that is strictly lower than the current one (ties: the whole
// group, then the larger k, then the lowest block). The micro-batch is
// re-scored from scratch and kept only if its time drops. Returns the
// sequences narrowed.
//
// Cost: O(n + D cp log cp) comm/comp evaluations for D sharded sequences,
// most candidates rejected without a comm look-up: a block rank whose
// compute alone (local + its new share) reaches the best time found cannot
// win, whatever its exchange.
inline int32_t pool_narrow(PlanMicroBatch& mb, const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                           const CostModel& cost, int32_t cp, int64_t bucket, NarrowScratch& w) {
  // Under whole_buffer a rank's distributed part is one kernel over every
  // set it holds, which this per-set formula does not price: such a
  // micro-batch keeps skrull's whole-group sets, priced by score_into.
  if (mb.groups != 1 || cp < 3 || cost.whole_buffer) return 0;
  w.order.clear();
  for (size_t q = 0; q < mb.seqs.size(); ++q)
    if (mb.num_ranks[q] == cp) w.order.push_back(static_cast<int32_t>(q));
  if (w.order.empty()) return 0;
  std::stable_sort(w.order.begin(), w.order.end(),
                   [&](int32_t a, int32_t b) { return lengths[mb.seqs[a]] > lengths[mb.seqs[b]]; });
  int32_t top = 1;
  while (top * 2 < cp) top *= 2;
  const int32_t base = mb.first_group * cp;
  pool_group_sums(mb, lengths, flops, cost, cp, w);
  double cur = 0.0;  // the micro-batch's time per layer as it stands
  for (int32_t j = 0; j < cp; ++j) cur = std::max(cur, pool_rank_us(cost, w.local[j], w.dist[j], w.bytes[j]));
  w.first_rank = mb.first_rank;
  w.num_ranks = mb.num_ranks;
  w.rest_us.resize(cp);
  int32_t narrowed = 0;
  for (int32_t q : w.order) {
    const int64_t s = lengths[mb.seqs[q]];
    const double f = flops[mb.seqs[q]];
    pool_group_move(w, cost, cp, s, f, 0, cp, -1);  // the rest, without it
    w.rest_known.assign(cp, 0);
    double best = cur;
    int32_t best_k = cp, best_first = 0;
    for (int32_t k = top; k >= 2; k /= 2) {
      const int64_t shard = shard_tokens(s, k);
      const double share = f / k, b = pool_group_bytes(cost, s, k, cp);
      for (int32_t first = 0; first + k <= cp; first += k) {
        bool open = true;  // fits, and no block rank's compute alone reaches best
        for (int32_t j = first; j < first + k && open; ++j)
          open = w.tokens[j] + shard <= bucket && cost.layer_us(0.0, w.local[j], w.dist[j] + share) < best;
        if (!open) continue;
        double t = 0.0;
        for (int32_t j = 0; j < cp && t < best; ++j) {
          if (j >= first && j < first + k) {
            t = std::max(t, pool_rank_us(cost, w.local[j], w.dist[j] + share, w.bytes[j] + b));
          } else {
            if (!w.rest_known[j]) {
              w.rest_us[j] = pool_rank_us(cost, w.local[j], w.dist[j], w.bytes[j]);
              w.rest_known[j] = 1;
            }
            t = std::max(t, w.rest_us[j]);
          }
        }
        if (t < best) {
          best = t;
          best_k = k;
          best_first = first;
        }
      }
    }
    pool_group_move(w, cost, cp, s, f, best_first, best_k, 1);
    if (best_k != cp) {
      mb.first_rank[q] = base + best_first;
      mb.num_ranks[q] = best_k;
      cur = best;
      ++narrowed;
    }
  }
  if (narrowed == 0) return 0;
  pool_group_sums(mb, lengths, flops, cost, cp, w);
  double t = 0.0;
  for (int32_t j = 0; j < cp; ++j) t = std::max(t, pool_rank_us(cost, w.local[j], w.dist[j], w.bytes[j]));
  t = t * cost.shape.layers + cost.micro_batch_fixed_us +
      cost.head_us(*std::max_element(w.tokens.begin(), w.tokens.end()));
  if (!(t < mb.time_us)) {  // rounding ate the gain: keep the micro-batch as it was
    mb.first_rank = w.first_rank;
    mb.num_ranks = w.num_ranks;
    return 0;
  }
  double comm_bytes = 0.0;  // real K/V bytes, as skrull reports them
  for (size_t q = 0; q < mb.seqs.size(); ++q) {
    const int32_t k = mb.num_ranks[q];
    if (k > 1) comm_bytes += cost.kv_bytes(shard_tokens(lengths[mb.seqs[q]], k) * static_cast<int64_t>(k));
  }
  mb.rank_tokens = w.tokens;
  mb.rank_flops.resize(cp);
  for (int32_t j = 0; j < cp; ++j) mb.rank_flops[j] = w.local[j] + w.dist[j];
  mb.comm_bytes = comm_bytes;
  mb.time_us = t;
  return narrowed;
}

// Most narrowed micro-batches narrow_for_the_step tries to set back one by
// one (each try replays the slots, O(M log M) for M micro-batches); beyond
// it the others stay narrowed. Real plans narrow a few.
constexpr size_t kMaxNarrowRevertTries = 256;

// Step 4 at the level of the step: narrows every one-group micro-batch
// (pool_narrow), keeps the result only if the step on the job's timeline
// gets shorter by more than kPoolMinGain, and then sets back, one at a time
// in plan order, each narrowed micro-batch whose own narrowing the step
// does not need (the step is no longer without it). A micro-batch faster off the critical path
// (a slot's non-slowest on lockstep, a group with slack free-running) buys
// nothing, and a narrower set is priced by assumption (the ring share, the
// table measured on whole groups): kept only for a shorter step, it cannot
// make the step longer under the model than the plan it came from, and it
// leaves skrull's placements where they do not pay. Expects `out` indexed
// and timed; leaves it timed. Returns the sequences left narrowed.
inline int32_t narrow_for_the_step(Plan& out, const std::vector<double>& flops, const CostModel& cost,
                                   const Options& opt) {
  const auto retime = [&]() { retime_plan(out, opt.timeline, cost.micro_batch_fixed_us, cost.step_fixed_us); };
  const double before = out.makespan_us;
  NarrowScratch scratch;
  std::vector<size_t> changed;
  std::vector<int32_t> count;
  std::vector<PlanMicroBatch> was;
  PlanMicroBatch copy;
  for (size_t m = 0; m < out.micro_batches.size(); ++m) {
    PlanMicroBatch& mb = out.micro_batches[m];
    if (mb.groups != 1 || opt.cp < 3) continue;
    copy = mb;
    const int32_t k = pool_narrow(mb, out.lengths, flops, cost, opt.cp, opt.bucket_size, scratch);
    if (k == 0) continue;
    changed.push_back(m);
    count.push_back(k);
    was.push_back(std::move(copy));
  }
  if (changed.empty()) return 0;
  retime();
  if (!(out.makespan_us < before * (1.0 - kPoolMinGain))) {  // no shorter step: every micro-batch as it was
    for (size_t i = 0; i < changed.size(); ++i) std::swap(out.micro_batches[changed[i]], was[i]);
    retime();
    return 0;
  }
  int32_t narrowed = 0;
  for (size_t i = 0; i < changed.size(); ++i) {
    double now = out.makespan_us;
    if (i < kMaxNarrowRevertTries) {
      std::swap(out.micro_batches[changed[i]], was[i]);  // as it was
      retime();
      if (out.makespan_us <= now) continue;  // the step does not need it
      std::swap(out.micro_batches[changed[i]], was[i]);  // narrowed again
      retime();
    }
    narrowed += count[i];
  }
  return narrowed;
}

// A pool plan priced under `cost` (hedge.hpp): a wide micro-batch as step
// 1b prices it, a one-group one whose sets are whole ranks or the whole
// group as skrull's DACP scores it, one with sub-group sets by pool_narrow's
// formula; then the slots replayed.
inline void reprice_pool_plan(Plan& out, const CostModel& cost, const Options& opt) {
  const int32_t cp = opt.cp;
  std::vector<double> flops, mb_flops;
  sequence_flops(out.lengths.data(), out.lengths.size(), cost, flops);
  std::vector<int64_t> mb_lengths;
  NarrowScratch w;
  DacpResult r;
  for (PlanMicroBatch& mb : out.micro_batches) {
    if (mb.groups > 1) {
      const int32_t seq = mb.seqs[0];
      const int64_t s = out.lengths[seq];
      mb.time_us = pool_wide_us(cost, s, flops[seq], mb.groups, cp, cost.comm.cross_group_factor) +
                   cost.micro_batch_fixed_us + cost.head_us(shard_tokens(s, mb.num_ranks[0]));
      continue;
    }
    bool whole = true;
    for (int32_t k : mb.num_ranks) whole = whole && (k == 1 || k == cp);
    if (whole) {
      const int32_t base = mb.first_group * cp;
      mb_lengths.clear();
      mb_flops.clear();
      r.cp_rank.clear();
      for (size_t q = 0; q < mb.seqs.size(); ++q) {
        mb_lengths.push_back(out.lengths[mb.seqs[q]]);
        mb_flops.push_back(flops[mb.seqs[q]]);
        r.cp_rank.push_back(mb.num_ranks[q] == cp && cp > 1 ? kDistributed : mb.first_rank[q] - base);
      }
      score_placement(mb_lengths.data(), mb_flops.data(), mb_lengths.size(), cost, cp, r);
      mb.time_us = r.time_us;
      continue;
    }
    pool_group_sums(mb, out.lengths, flops, cost, cp, w);
    double t = 0.0;
    for (int32_t j = 0; j < cp; ++j) t = std::max(t, pool_rank_us(cost, w.local[j], w.dist[j], w.bytes[j]));
    mb.time_us = t * cost.shape.layers + cost.micro_batch_fixed_us +
                 cost.head_us(*std::max_element(w.tokens.begin(), w.tokens.end()));
  }
  retime_plan(out, opt.timeline, cost.micro_batch_fixed_us, cost.step_fixed_us);
}

// Step 0: the checks, and the plan's per-sequence arrays with the lengths
// cut to what the world holds (opt.overlength beyond it); `live` gets the
// sequences kept, ascending.
inline Plan pool_start(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt,
                       std::vector<int32_t>& live) {
  validate_options(opt);
  cost.validate();
  validate_lengths(input, "global batch");
  const int64_t world = static_cast<int64_t>(opt.dp) * opt.cp;
  if (static_cast<int64_t>(input.size()) * world > kMaxSequenceRanks)
    throw std::invalid_argument("global batch has " + std::to_string(input.size()) + " sequences x world " +
                                std::to_string(world) + " ranks, more than the limit " +
                                std::to_string(kMaxSequenceRanks) + " (the pool plan would not fit in memory)");
  Plan out;
  const int32_t n = static_cast<int32_t>(input.size());
  LengthCut cut = cut_overlength(input, opt, {world, "the world", "bucket_size " + std::to_string(opt.bucket_size) +
                                              " x dp " + std::to_string(opt.dp) + " x cp " + std::to_string(opt.cp),
                                              "bucket_size"});
  out.lengths = std::move(cut.lengths);
  out.dropped = std::move(cut.dropped);
  out.truncated = std::move(cut.truncated);
  live = std::move(cut.live);
  out.micro_batch.assign(n, -1);
  out.first_rank.assign(n, 0);
  out.num_ranks.assign(n, 0);
  out.group_time_us.assign(opt.dp, 0.0);
  return out;
}

// Skrull's plan of the live sequences (schedule(), their lengths already
// cut), in the pool's form and the caller's indices: the candidate to beat.
inline Plan pool_skrull_plan(const std::vector<int64_t>& lengths, const std::vector<int32_t>& live,
                             const CostModel& cost, const Options& opt) {
  std::vector<int64_t> kept(live.size());
  for (size_t p = 0; p < live.size(); ++p) kept[p] = lengths[live[p]];
  Options sk = opt;
  sk.overlength = Overlength::kError;
  Schedule s = schedule(kept, cost, sk);
  for (MicroBatch& mb : s.micro_batches)
    for (int32_t& k : mb.seqs) k = live[k];  // back to the caller's indices
  Plan out;
  plan_from_schedule(s, opt.cp, out);
  return out;
}

// Takes skrull's micro-batches and times as the answer (its placements are
// already in the pool's form); `skrull` is left with `out`'s micro-batches.
inline void pool_adopt(Plan& out, Plan& skrull) {
  std::swap(out.micro_batches, skrull.micro_batches);
  out.group_time_us = skrull.group_time_us;
  out.makespan_us = skrull.makespan_us;
  out.slots = skrull.slots;
  out.rollbacks = skrull.rollbacks;
  out.moves = skrull.moves;
  out.widened = 0;
  out.skrull_plan = true;
}

// A sequence that goes wide (step 1): over `groups` CP groups, in `time`.
struct PoolWide {
  int32_t seq, groups;
  double time;
};

// Step 1: which live sequences go wide, and over how many groups: those a
// group cannot hold, and those whose time over their own group alone
// exceeds pool_widen x a group's ideal time. Each takes the fewest groups
// that meet that target, else the fastest span.
inline std::vector<PoolWide> pool_wide_sequences(const std::vector<int64_t>& lengths, const std::vector<int32_t>& live,
                                                 const std::vector<double>& flops, const CostModel& cost,
                                                 const Options& opt) {
  const int32_t cp = opt.cp;
  const int64_t world = static_cast<int64_t>(opt.dp) * cp;
  const int64_t group_limit = max_sequence_length(opt.bucket_size, cp);
  double total = 0.0;
  for (int32_t k : live) total += flops[k];
  // A group's ideal time: its share of the FLOPs, and at least one call a
  // layer at the host floor.
  const double ideal = std::max(cost.shape.layers * cost.a_us_per_flop * total / static_cast<double>(world),
                                cost.shape.layers * cost.host_floor_us);
  const double target = ideal * opt.pool_widen;
  const std::vector<int32_t> spans = pool_spans(opt.dp);
  std::vector<PoolWide> wide;
  for (int32_t k : live) {
    if (spans.empty()) break;
    const int64_t s = lengths[k];
    const bool must = s > group_limit;
    if (!must && !(pool_wide_us(cost, s, flops[k], 1, cp, cost.comm.cross_group_factor) > target)) continue;
    int32_t best = 0;
    double best_t = std::numeric_limits<double>::infinity();
    for (int32_t g : spans) {
      if (shard_tokens(s, g * cp) > opt.bucket_size) continue;
      const double t = pool_wide_us(cost, s, flops[k], g, cp, cost.comm.cross_group_factor);
      if (t < best_t) {
        best = g;
        best_t = t;
      }
      if (t <= target) break;  // the fewest groups that meet the target
    }
    if (best == 0) continue;  // unreachable: g = dp holds every s <= limit
    wide.push_back({k, best, best_t});
  }
  return wide;
}

// Step 1b: the wide micro-batches, longest time first, each on the aligned
// block whose groups free up first (ties to the lowest block). Advances each
// group's clock (out.group_time_us) and next slot.
inline void pool_place_wide(Plan& out, std::vector<PoolWide> wide, const std::vector<double>& flops,
                            const CostModel& cost, const Options& opt, std::vector<int32_t>& next_slot) {
  const int32_t dp = opt.dp, cp = opt.cp;
  std::stable_sort(wide.begin(), wide.end(), [](const PoolWide& a, const PoolWide& b) { return a.time > b.time; });
  std::vector<double>& clock = out.group_time_us;
  for (const PoolWide& w : wide) {
    int32_t first = 0;
    double ready = std::numeric_limits<double>::infinity();
    const int32_t step = (w.groups & (w.groups - 1)) == 0 ? w.groups : dp;  // dp itself: one block
    for (int32_t b = 0; b + w.groups <= dp; b += step) {
      const double r = *std::max_element(clock.begin() + b, clock.begin() + b + w.groups);
      if (r < ready) {
        ready = r;
        first = b;
      }
    }
    PlanMicroBatch mb;
    mb.first_group = first;
    mb.groups = w.groups;
    mb.slot = *std::max_element(next_slot.begin() + first, next_slot.begin() + first + w.groups);
    const int32_t k = w.groups * cp;
    const int64_t shard = shard_tokens(out.lengths[w.seq], k);
    mb.seqs = {w.seq};
    mb.first_rank = {first * cp};
    mb.num_ranks = {k};
    mb.rank_tokens.assign(k, shard);
    mb.rank_flops.assign(k, flops[w.seq] / k);
    mb.comm_bytes = cost.kv_bytes(shard * static_cast<int64_t>(k));
    mb.start_us = ready;
    // Its own micro-batch: it pays the fixed cost and the head's time on its
    // shard too (the choice of span above compares compute and exchange alone).
    mb.time_us = w.time + cost.micro_batch_fixed_us + cost.head_us(shard);
    for (int32_t g = first; g < first + w.groups; ++g) {
      clock[g] = ready + mb.time_us;
      next_slot[g] = mb.slot + 1;
    }
    out.micro_batches.push_back(std::move(mb));
  }
  out.widened = static_cast<int32_t>(wide.size());
}

// Step 2a: the live sequences not wide, over the groups by LPT (gds.hpp's
// lpt_bins) on estimated time on top of the wide work (the groups' clocks),
// longest first (ties by index). Each group's share, longest first.
inline std::vector<std::vector<int32_t>> pool_shares(const Plan& out, const std::vector<int32_t>& live,
                                                     const std::vector<PoolWide>& wide,
                                                     const std::vector<double>& flops, const CostModel& cost,
                                                     int32_t cp) {
  std::vector<char> is_wide(out.lengths.size(), 0);
  for (const PoolWide& w : wide) is_wide[w.seq] = 1;
  std::vector<int32_t> order, scratch;
  for (int32_t k : live)
    if (!is_wide[k]) order.push_back(k);
  sort_descending_by_length(out.lengths, order, scratch);
  // Balanced by FLOPs: sequences that share a group share its calls, so the
  // host floor is no sequence's own (the group's micro-batches are priced
  // floored by skrull's DACP).
  const double per_flop = cost.shape.layers * cost.a_us_per_flop / cp;
  std::vector<double> time(flops.size());
  for (int32_t k : order) time[k] = per_flop * flops[k];
  return lpt_bins(order, time, out.group_time_us);
}

// Micro-batch j of group g's split of `sorted` (its share, ascending),
// scored as skrull's DACP scores it.
inline PlanMicroBatch pool_group_micro_batch(const Plan& out, int32_t g, int32_t j, const MicroBatchSplit& split,
                                             const std::vector<int32_t>& sorted, const std::vector<double>& flops,
                                             const CostModel& cost, int32_t cp, DacpResult& scored) {
  PlanMicroBatch mb;
  mb.first_group = g;
  std::vector<int64_t> group_lengths;
  std::vector<double> group_flops;
  scored.cp_rank.clear();
  for (int32_t q = split.member_start[j]; q < split.member_start[j + 1]; ++q) {
    const int32_t p = split.members[q];
    const int32_t k = sorted[p];
    const int32_t c = split.placement[p];
    const bool dist = c == kDistributed && cp > 1;
    mb.seqs.push_back(k);
    mb.first_rank.push_back(g * cp + (c == kDistributed ? 0 : c));
    mb.num_ranks.push_back(dist ? cp : 1);
    scored.cp_rank.push_back(c);
    group_lengths.push_back(out.lengths[k]);
    group_flops.push_back(flops[k]);
  }
  score_placement(group_lengths.data(), group_flops.data(), group_lengths.size(), cost, cp, scored);
  mb.rank_tokens = scored.rank_tokens;
  mb.rank_flops = scored.rank_flops;
  mb.comm_bytes = scored.comm_bytes;
  mb.time_us = scored.time_us;
  mb.rollbacks = split.rollbacks[j];
  mb.moves = split.moves[j];
  return mb;
}

// Step 2b: each group's share split into micro-batches by skrull's GDS +
// DACP (split_share, the same options), after its wide work.
inline void pool_plan_groups(Plan& out, const std::vector<std::vector<int32_t>>& shares,
                             const std::vector<double>& flops, const CostModel& cost, const Options& opt,
                             std::vector<int32_t>& next_slot) {
  Workspace ws;
  std::vector<int32_t> sorted;
  DacpResult scored;
  std::vector<double>& clock = out.group_time_us;
  for (int32_t g = 0; g < opt.dp; ++g) {
    reverse_to_ascending(out.lengths, shares[g], sorted);
    const MicroBatchSplit split = split_share(out.lengths, flops, sorted, cost, opt, ws);
    if (!split.feasible) throw std::logic_error("no micro-batch split found for group " + std::to_string(g));
    for (int32_t j = 0; j < split.m; ++j) {
      PlanMicroBatch mb = pool_group_micro_batch(out, g, j, split, sorted, flops, cost, opt.cp, scored);
      mb.slot = next_slot[g] + j;
      mb.start_us = clock[g];
      clock[g] += mb.time_us;
      out.rollbacks += mb.rollbacks;
      out.moves += mb.moves;
      out.micro_batches.push_back(std::move(mb));
    }
    next_slot[g] += split.m;
  }
  out.slots = *std::max_element(next_slot.begin(), next_slot.end());
}

// With a hedged model: the plan kept priced at `price`, and the pool's own
// plan (widened or narrowed) kept only if its step is shorter than skrull's
// (`skrull_as_planned`, its micro-batches as planned) by more than
// kPoolMinGain there too.
inline void pool_settle_at_price(Plan& out, Plan& skrull, std::vector<PlanMicroBatch> skrull_as_planned,
                                 const CostModel& price, const Options& opt) {
  reprice_pool_plan(out, price, opt);
  if (skrull_as_planned.empty() || (out.skrull_plan && out.narrowed == 0)) return;
  Plan pool = out;  // the pool's own plan (widened or narrowed), at `price`
  skrull.micro_batches = std::move(skrull_as_planned);
  pool_adopt(out, skrull);
  out.narrowed = 0;
  index_plan(out);
  reprice_pool_plan(out, price, opt);
  if (pool.makespan_us < out.makespan_us * (1.0 - kPoolMinGain)) out = std::move(pool);
}

// schedule_pool() deciding with `cost`. With `price` (a hedged model,
// hedge.hpp; `cost` is its planning_model), the plan kept is priced under
// `price`, and the pool's own plan (widened or narrowed) is kept only if its
// step is shorter than skrull's by more than kPoolMinGain there too: a gain
// under the planning model alone is not a gain (the pool's contract, a
// departure from skrull only for a shorter step, holds for the times the
// plan reports). The steps are those at the top of this file.
inline Plan schedule_pool_as_priced(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt,
                                    const CostModel* price = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> live;
  Plan out = pool_start(input, cost, opt, live);
  const int64_t group_limit = max_sequence_length(opt.bucket_size, opt.cp);
  bool fits_groups = true;
  for (int32_t k : live) fits_groups = fits_groups && out.lengths[k] <= group_limit;
  Plan skrull_plan;  // the candidate to beat, when every sequence fits a group
  double skrull_us = std::numeric_limits<double>::infinity();
  std::vector<PlanMicroBatch> skrull_as_planned;  // to compare with at `price`
  if (fits_groups) {
    skrull_plan = pool_skrull_plan(out.lengths, live, cost, opt);
    skrull_us = skrull_plan.makespan_us;
    if (price != nullptr) skrull_as_planned = skrull_plan.micro_batches;
  }
  std::vector<double> flops;
  sequence_flops(out.lengths.data(), out.lengths.size(), cost, flops);
  const std::vector<PoolWide> wide = pool_wide_sequences(out.lengths, live, flops, cost, opt);
  if (wide.empty() && fits_groups) {  // nothing to widen: skrull's plan as is
    pool_adopt(out, skrull_plan);
  } else {
    std::vector<int32_t> next_slot(opt.dp, 0);
    pool_place_wide(out, wide, flops, cost, opt, next_slot);
    pool_plan_groups(out, pool_shares(out, live, wide, flops, cost, opt.cp), flops, cost, opt, next_slot);
    retime_plan(out, opt.timeline, cost.micro_batch_fixed_us, cost.step_fixed_us);
    // 3. Skrull's plan unless the pool's predicts a step shorter by more than
    // kPoolMinGain (both on the job's timeline).
    if (!(out.makespan_us < skrull_us * (1.0 - kPoolMinGain))) pool_adopt(out, skrull_plan);
  }
  // 4. Sub-group sets in the one-group micro-batches of the plan kept (see
  // pool_narrow), kept only where they shorten the step (narrow_for_the_step).
  index_plan(out);
  retime_plan(out, opt.timeline, cost.micro_batch_fixed_us, cost.step_fixed_us);
  out.narrowed = narrow_for_the_step(out, flops, cost, opt);
  index_plan(out);
  if (price != nullptr) pool_settle_at_price(out, skrull_plan, std::move(skrull_as_planned), *price, opt);
  out.elapsed_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace detail

// Plans one global batch over the dp x cp world as one pool (see the top of
// this file). Sequences up to max_sequence_length(bucket_size, dp * cp) are
// planned whole; only longer ones meet opt.overlength. Throws
// std::invalid_argument as schedule() does. A cost model with
// comm.plan_margin above 1 decides with its planning_model and prices the
// plan with itself (hedge.hpp).
inline Plan schedule_pool(const std::vector<int64_t>& input, const CostModel& cost, const Options& opt) {
  if (!hedged(cost)) return detail::schedule_pool_as_priced(input, cost, opt);
  cost.validate();
  return detail::schedule_pool_as_priced(input, planning_model(cost), opt, &cost);
}

}  // namespace skrull
