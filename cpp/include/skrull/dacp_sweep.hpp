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
#include <numeric>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

// Candidate k shards the k longest sequences over the group and places the
// rest longest first (LPT by FLOPs) on the least-loaded rank, else the rank
// with most room, else shards it if every rank has room for its shard.
// Every k from 0 up is scored with the cost model; the fastest wins (ties
// to fewer shards). The sweep stops when the k longest shards no longer fit
// or (with a non-decreasing comm table) when the sharded part alone,
// comm(V_k) + comp(D_k), which only grows with k, cannot beat the best.
//
// Returns placements in the caller's order, kUnschedulable when no
// candidate fits. rollbacks is 0: the sweep never undoes a placement.
//
// Bounded time: each candidate costs O(n cp), so k stops at
// kMaxSweepShards: O(kMaxSweepShards n cp) per micro-batch. Uncapped, 8,000
// tiny sequences took 0.35 s (O(n^2 cp)); real micro-batches are smaller
// than the cap, so their plans are unchanged.
constexpr size_t kMaxSweepShards = 256;

inline DacpResult dacp_sweep(const int64_t* lengths, size_t n, const CostModel& cost, int32_t cp, int64_t bucket) {
  DacpResult best;
  best.status = Status::kUnschedulable;
  best.cp_rank.assign(n, kDistributed);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [lengths](int32_t a, int32_t b) {
    return lengths[a] != lengths[b] ? lengths[a] > lengths[b] : a < b;
  });
  const bool prune = cost.comm_is_monotone();
  bool found = false;
  int64_t prefix_shard = 0;  // tokens per rank of the k longest, sharded
  double dist_flops = 0.0;   // one rank's FLOPs of them
  double volume = 0.0;       // their K/V bytes
  DacpResult cand;
  std::vector<int64_t> room(cp);
  std::vector<double> load(cp);
  const size_t last = std::min(n, kMaxSweepShards);
  for (size_t k = 0; k <= last; ++k) {
    if (k > 0) {
      const int64_t s = lengths[order[k - 1]];
      const int64_t shard = shard_tokens(s, cp);
      prefix_shard += shard;
      if (prefix_shard > bucket) break;
      dist_flops += cost.flops(s) / cp;
      volume += cost.kv_bytes(shard * cp);
      if (found && prune && cost.shape.layers * (cost.comm_us(volume) + cost.comp_us(dist_flops)) >= best.time_us)
        break;
    }
    cand.cp_rank.assign(n, kDistributed);
    std::fill(room.begin(), room.end(), bucket - prefix_shard);
    std::fill(load.begin(), load.end(), 0.0);
    bool ok = true;
    for (size_t p = k; p < n && ok; ++p) {
      const int32_t i = order[p];
      const int64_t s = lengths[i];
      int32_t t = detail::argmin(load);
      if (room[t] < s) t = detail::argmax(room);
      if (room[t] >= s) {
        cand.cp_rank[i] = t;
        room[t] -= s;
        load[t] += cost.flops(s);
        continue;
      }
      const int64_t shard = shard_tokens(s, cp);
      ok = *std::min_element(room.begin(), room.end()) >= shard;
      if (ok)
        for (int32_t j = 0; j < cp; ++j) room[j] -= shard;
    }
    if (!ok) continue;
    score_placement(lengths, n, cost, cp, cand);
    if (!found || cand.time_us < best.time_us) {
      best = cand;
      found = true;
    }
  }
  if (found) {
    best.status = Status::kOk;
  } else {
    score_placement(lengths, n, cost, cp, best);
  }
  return best;
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
inline Status dacp_for_into(const int64_t* lengths, size_t n, const CostModel& cost, const Options& opt,
                            Workspace& ws, int32_t* placement, int32_t& rollbacks, int32_t& moves, double& time) {
  const bool ok = dacp_into(lengths, n, cost, opt.cp, opt.bucket_size, opt.placement, opt.rollback, opt.refine, ws,
                            placement, rollbacks, moves) == Status::kOk;
  double comm_bytes = 0.0;
  time = ok ? score_into(lengths, placement, n, cost, opt.cp, ws.tokens, ws.flops, comm_bytes) : 0.0;
  if (opt.dacp_search == DacpSearch::kShardSweep && opt.cp > 1 &&
      (!ok || time > (1.0 + opt.sweep_margin) * cost.micro_batch_lower_bound_us(lengths, n, opt.cp))) {
    const DacpResult sweep = dacp_sweep(lengths, n, cost, opt.cp, opt.bucket_size);
    if (sweep.status == Status::kOk && (!ok || sweep.time_us < time)) {
      std::copy(sweep.cp_rank.begin(), sweep.cp_rank.end(), placement);
      time = sweep.time_us;
      rollbacks = moves = 0;
      return Status::kOk;
    }
  }
  return ok ? Status::kOk : Status::kUnschedulable;
}

// Checked: throws std::invalid_argument for arguments outside validate.hpp's ranges.
inline DacpResult dacp_for(const std::vector<int64_t>& lengths, const CostModel& cost, const Options& opt) {
  validate_options(opt);
  validate_micro_batch(lengths, cost, opt.cp, opt.bucket_size);
  Workspace ws;
  DacpResult r;
  r.cp_rank.resize(lengths.size());
  double time = 0.0;
  r.status = dacp_for_into(lengths.data(), lengths.size(), cost, opt, ws, r.cp_rank.data(), r.rollbacks, r.moves, time);
  score_placement(lengths.data(), lengths.size(), cost, opt.cp, r);
  return r;
}

}  // namespace skrull
