// DACP by a sweep over how many of the longest sequences to shard: this
// project's addition to the paper's Algorithm 1, and the micro-batch
// placement entry point that picks between them (dacp_for).
//
// Why: Algorithm 1 keeps a sequence local whenever it fits, so one long
// sequence placed whole makes its rank the straggler of the micro-batch
// while the other ranks idle; sharding it would cost an exchange that the
// local work can hide. The sweep scores that trade-off with the cost model
// instead of a rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/hedge.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

// Candidate k shards the k longest sequences over the group and places the
// rest longest first (LPT by FLOPs) on the least-loaded rank, else the rank
// with most room, else shards it if every rank has room for its shard.
// Of all k whose k longest shards fit (k up to kMaxSweepShards), the fastest
// predicted candidate wins, ties to fewer shards.
//
// Returns placements in the caller's order, kUnschedulable when no
// candidate fits. rollbacks is 0: the sweep never undoes a placement.
//
// Branch and bound, same answer as scoring every k. Each candidate has a
// lower bound computed from prefix sums in O(1) (sweep_bound below);
// the one with the least bound is placed and scored first, then only those
// whose bound is below the best time found: the others cannot beat it. On
// real micro-batches about 2 candidates are placed instead of 9
// (docs/latency.md).
//
// Bounded time: each placed candidate costs O(n cp), so k stops at
// kMaxSweepShards: O(kMaxSweepShards n cp) per micro-batch at worst.
// Uncapped, 8,000 tiny sequences took 0.35 s (O(n^2 cp)); real
// micro-batches are smaller than the cap, so their plans are unchanged.
constexpr size_t kMaxSweepShards = 256;

namespace detail {

// Relative slack on the bound test: the bound and a candidate's score sum
// the same FLOPs and bytes in different orders, so they may differ in the
// last bits; a bound within this slack of the best never prunes.
constexpr double kSweepBoundSlack = 1e-9;

// Lower bound on candidate k's predicted time. With D, V the sharded
// prefix's per-rank FLOPs and bytes, R the FLOPs of the rest and L the
// largest local FLOPs of any rank, the time is
//   layers * max(floor, max(comm(V'), line(L)) + line(D')) + fixed
// with D' >= D, V' >= V (the LPT fallback may shard more of the rest: each
// FLOP moved from local to sharded lowers L by at most 1/cp of it and raises
// D' by exactly that), so max(comm(V), line(R / cp)) + line(D) bounds the
// device's part, dropping line's per-call term from the local part unless
// some rest sequence is surely local: the longest of the rest always is
// when it fits the room left, as the LPT places it first on an empty rank,
// and then its own FLOPs bound L too. comm(V) counts only with a
// non-decreasing table. The host floor is charged once a layer call
// (cost_model.hpp layer_us), so it only holds that up, as some rank makes
// a call whenever the micro-batch has FLOPs.
inline double sweep_bound(const CostModel& cost, int32_t cp, bool monotone, double volume, double dist_flops,
                          double rest_flops, bool first_local, double first_flops) {
  const double comm = monotone ? cost.comm_us(volume) : 0.0;
  const double local = first_local ? cost.line_us(std::max(rest_flops / cp, first_flops))
                                   : cost.a_us_per_flop * rest_flops / cp;
  const double device = std::max(comm, local) + cost.line_us(dist_flops);
  return cost.shape.layers * cost.held_to_floor_us(device, rest_flops + dist_flops > 0.0) + cost.micro_batch_fixed_us;
}

}  // namespace detail

// The sweep into caller buffers: writes the winning placement (caller's
// order) into `placement` and its time into `time`, and returns true, when
// some candidate fits and predicts strictly faster than `incumbent` (pass
// infinity for the plain sweep); else returns false and leaves them alone.
// An incumbent prunes more: dacp_for passes Algorithm 1's time, which the
// sweep must beat to be used at all.
inline bool dacp_sweep_into(const int64_t* lengths, const double* seq_flops, size_t n, const CostModel& cost,
                            int32_t cp, int64_t bucket, double incumbent, Workspace& ws, int32_t* placement,
                            double& time) {
  std::vector<int32_t>& order = ws.sweep_order;
  detail::descending_order(lengths, n, order);
  const bool monotone = cost.comm_is_monotone();
  const size_t last = std::min(n, kMaxSweepShards);
  std::vector<double>& rest = ws.sweep_rest;
  rest.assign(n + 1, 0.0);
  auto fl = [&](size_t p) { return seq_flops[order[p]]; };  // by position in `order`
  for (size_t p = n; p-- > 0;) rest[p] = rest[p + 1] + fl(p);

  // The candidates (every k whose sharded prefix fits) and their bounds.
  std::vector<int64_t>& prefix = ws.sweep_prefix;
  std::vector<double>& bound = ws.sweep_bound;
  prefix.assign(1, 0);
  bound.clear();
  double dist_flops = 0.0;  // one rank's FLOPs of the k longest
  double volume = 0.0;      // their K/V bytes
  size_t first = 0;         // the candidate with the least bound
  for (size_t k = 0; k <= last; ++k) {
    if (k > 0) {
      const int64_t shard = shard_tokens(lengths[order[k - 1]], cp);
      if (prefix.back() + shard > bucket) break;
      dist_flops += fl(k - 1) / cp;
      volume += cost.kv_bytes(shard * cp);
      // With a non-decreasing comm table, the sharded prefix alone costs
      // every rank max(floor, comm(V) + line(D)) a layer and only grows with
      // k: once it reaches the incumbent, no larger k can beat it.
      if (monotone && cost.layers_us(cost.comm_us(volume), 0.0, dist_flops) >= incumbent)
        break;
      prefix.push_back(prefix.back() + shard);
    }
    const bool first_local = k < n && lengths[order[k]] <= bucket - prefix[k];
    bound.push_back(detail::sweep_bound(cost, cp, monotone, volume, dist_flops, rest[k], first_local,
                                        k < n ? fl(k) : 0.0));
    if (bound[k] < bound[first]) first = k;
  }

  // Score the least bound first, then every k in order whose bound can
  // still beat the best (ties to fewer shards).
  std::vector<int32_t>& cand = ws.sweep_candidate;
  std::vector<int64_t>& room = ws.room;
  std::vector<double>& load = ws.load;
  bool found = false;
  size_t best_k = 0;
  double best = incumbent;
  auto try_candidate = [&](size_t k) {
    if (bound[k] > best * (1.0 + detail::kSweepBoundSlack)) return;
    cand.assign(n, kDistributed);
    room.assign(cp, bucket - prefix[k]);
    load.assign(cp, 0.0);
    for (size_t p = k; p < n; ++p) {
      const int32_t i = order[p];
      const int64_t s = lengths[i];
      int32_t t = detail::argmin(load);
      if (room[t] < s) t = detail::argmax(room);
      if (room[t] >= s) {
        cand[i] = t;
        room[t] -= s;
        load[t] += fl(p);
        continue;
      }
      const int64_t shard = shard_tokens(s, cp);
      if (*std::min_element(room.begin(), room.end()) < shard) return;  // does not fit
      for (int32_t j = 0; j < cp; ++j) room[j] -= shard;
    }
    double bytes = 0.0;
    const double t = score_into(lengths, seq_flops, cand.data(), n, cost, cp, ws.tokens, ws.flops, bytes);
    if (t < best || (found && t == best && k < best_k)) {
      best = t;
      best_k = k;
      found = true;
      std::copy(cand.begin(), cand.end(), placement);
    }
  };
  try_candidate(first);
  for (size_t k = 0; k < bound.size(); ++k)
    if (k != first) try_candidate(k);
  if (found) time = best;
  return found;
}

inline DacpResult dacp_sweep(const int64_t* lengths, size_t n, const CostModel& cost, int32_t cp, int64_t bucket) {
  Workspace ws;
  detail::sequence_flops(lengths, n, cost, ws.seq_flops);
  DacpResult r;
  r.cp_rank.assign(n, kDistributed);
  double time = 0.0;
  r.status = dacp_sweep_into(lengths, ws.seq_flops.data(), n, cost, cp, bucket,
                             std::numeric_limits<double>::infinity(), ws, r.cp_rank.data(), time)
                 ? Status::kOk
                 : Status::kUnschedulable;
  score_placement(lengths, ws.seq_flops.data(), n, cost, cp, r);
  return r;
}

// Checked: throws std::invalid_argument for arguments outside validate.hpp's ranges.
inline DacpResult dacp_sweep(const std::vector<int64_t>& lengths, const CostModel& cost, int32_t cp, int64_t bucket) {
  validate_micro_batch(lengths, cost, cp, bucket);
  return dacp_sweep(lengths.data(), lengths.size(), cost, cp, bucket);
}

// The placement of one micro-batch that the options ask for: Algorithm 1
// (or 4, refined when opt.refine); with DacpSearch::kShardSweep (and cp > 1)
// also the sweep, keeping the faster predicted one (ties to Algorithm 1), or
// the sweep's when only it fits in memory. The sweep (O(n^2)) is skipped
// when Algorithm 1 is already within opt.sweep_margin of the lower bound:
// it could gain at most that much. Writes the placement and returns
// the status; `time` gets the predicted time. The one place GDS and the
// single-micro-batch API choose a placement.
inline Status dacp_for_into(const int64_t* lengths, const double* seq_flops, size_t n, const CostModel& cost,
                            const Options& opt, Workspace& ws, int32_t* placement, int32_t& rollbacks, int32_t& moves,
                            double& time) {
  const bool ok = dacp_into(lengths, seq_flops, n, cost, opt.cp, opt.bucket_size, opt.placement, opt.rollback,
                            opt.refine, ws, placement, rollbacks, moves) == Status::kOk;
  double comm_bytes = 0.0;
  time = ok ? score_into(lengths, seq_flops, placement, n, cost, opt.cp, ws.tokens, ws.flops, comm_bytes) : 0.0;
  // The margin is on the part a placement changes: every placement pays the
  // micro-batch's fixed cost, so it neither helps nor hides a gain.
  const double fixed = cost.micro_batch_fixed_us;
  if (opt.dacp_search == DacpSearch::kShardSweep && opt.cp > 1 &&
      (!ok ||
       time - fixed > (1.0 + opt.sweep_margin) * (cost.micro_batch_lower_bound_us(lengths, n, opt.cp, seq_flops) - fixed))) {
    const double incumbent = ok ? time : std::numeric_limits<double>::infinity();
    if (dacp_sweep_into(lengths, seq_flops, n, cost, opt.cp, opt.bucket_size, incumbent, ws, placement, time)) {
      rollbacks = moves = 0;
      return Status::kOk;
    }
  }
  return ok ? Status::kOk : Status::kUnschedulable;
}

// Checked: throws std::invalid_argument for arguments outside validate.hpp's ranges.
// A cost model with comm.plan_margin above 1 places with its planning_model
// and scores the placement with itself (hedge.hpp), as schedule() does.
inline DacpResult dacp_for(const std::vector<int64_t>& lengths, const CostModel& cost, const Options& opt) {
  validate_options(opt);
  validate_micro_batch(lengths, cost, opt.cp, opt.bucket_size);
  if (hedged(cost)) {
    DacpResult r = dacp_for(lengths, planning_model(cost), opt);
    score_placement(lengths.data(), lengths.size(), cost, opt.cp, r);
    return r;
  }
  Workspace ws;
  detail::sequence_flops(lengths.data(), lengths.size(), cost, ws.seq_flops);
  DacpResult r;
  r.cp_rank.resize(lengths.size());
  double time = 0.0;
  r.status = dacp_for_into(lengths.data(), ws.seq_flops.data(), lengths.size(), cost, opt, ws, r.cp_rank.data(),
                           r.rollbacks, r.moves, time);
  score_placement(lengths.data(), ws.seq_flops.data(), lengths.size(), cost, opt.cp, r);
  return r;
}

}  // namespace skrull
