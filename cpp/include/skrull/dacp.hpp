// DACP (docs/design/algorithms.md, corrected Algorithm 1, and the paper's
// worst-fit Algorithm 4): for one micro-batch on one CP group, decide which
// sequences stay whole on one CP rank and which are sharded over the group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/refine.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

namespace detail {

// Lowest index of the smallest / largest element: ties go to the lower rank
// so every rank computes the same plan. Written as selects over a local
// pointer, not branches: these run once or twice per placed sequence over a
// handful of ranks, on comparisons a branch predictor cannot guess (twice
// as fast as std::min_element here).
template <typename T, typename Better>
int32_t arg_first_best(const std::vector<T>& v, Better better) {
  const T* p = v.data();
  const int32_t n = static_cast<int32_t>(v.size());
  int32_t best = 0;
  T top = p[0];
  for (int32_t j = 1; j < n; ++j) {
    const T x = p[j];
    const bool b = better(x, top);
    top = b ? x : top;
    best = b ? j : best;
  }
  return best;
}
template <typename T>
int32_t argmin(const std::vector<T>& v) {
  return arg_first_best(v, [](T a, T b) { return a < b; });
}
template <typename T>
int32_t argmax(const std::vector<T>& v) {
  return arg_first_best(v, [](T a, T b) { return a > b; });
}

// Ascending by length, ties by index: the processing order of Algorithm 1.
inline void ascending_order(const int64_t* lengths, size_t n, std::vector<int32_t>& order) {
  order.resize(n);
  std::iota(order.begin(), order.end(), 0);
  bool sorted = true;
  for (size_t i = 1; i < n && sorted; ++i) sorted = lengths[i - 1] <= lengths[i];
  if (sorted) return;  // GDS hands over groups already in this order
  std::sort(order.begin(), order.end(), [lengths](int32_t a, int32_t b) {
    return lengths[a] != lengths[b] ? lengths[a] < lengths[b] : a < b;
  });
}

// Descending by length, ties by index: the order of the shard sweep. A
// group GDS hands over is ascending (length, index); then this is its
// reverse with each run of equal lengths put back in index order, O(n).
inline void descending_order(const int64_t* lengths, size_t n, std::vector<int32_t>& order) {
  order.resize(n);
  bool ascending = true;
  for (size_t i = 1; i < n && ascending; ++i) ascending = lengths[i - 1] <= lengths[i];
  if (!ascending) {
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [lengths](int32_t a, int32_t b) {
      return lengths[a] != lengths[b] ? lengths[a] > lengths[b] : a < b;
    });
    return;
  }
  for (size_t p = 0; p < n;) {  // runs of equal lengths from the longest
    size_t q = p;
    const int64_t s = lengths[n - 1 - p];
    while (q < n && lengths[n - 1 - q] == s) ++q;
    for (size_t r = p; r < q; ++r) order[r] = static_cast<int32_t>(n - q + (r - p));
    p = q;
  }
}

// Each sequence's forward FLOPs per layer, computed once: the heuristics
// look them up many times per micro-batch.
inline void sequence_flops(const int64_t* lengths, size_t n, const CostModel& cost, std::vector<double>& out) {
  out.resize(n);
  for (size_t i = 0; i < n; ++i) out[i] = cost.flops(lengths[i]);
}

}  // namespace detail

// Tokens, FLOPs and bytes of a placement and its predicted time: the single
// place where a placement is turned into figures. Heuristics, the exact
// solver's answers and the simulator's baselines are all scored here.
// Writes per-rank tokens and total FLOPs (local + distributed share) into
// the caller's buffers; returns the predicted time. seq_flops[i] is
// cost.flops(lengths[i]) (detail::sequence_flops).
inline double score_into(const int64_t* lengths, const double* seq_flops, const int32_t* cp_rank, size_t n,
                         const CostModel& cost, int32_t cp, std::vector<int64_t>& tokens, std::vector<double>& flops,
                         double& comm_bytes) {
  tokens.assign(cp, 0);
  flops.assign(cp, 0.0);
  comm_bytes = 0.0;
  double dist_flops = 0.0;
  int64_t dist_shard = 0;
  int64_t dist_tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = lengths[i];
    if (cp_rank[i] == kDistributed) {
      const int64_t shard = shard_tokens(s, cp);
      dist_shard += shard;
      dist_tokens += s;
      dist_flops += seq_flops[i] / cp;
      comm_bytes += cost.kv_bytes(shard * cp);
    } else {
      tokens[cp_rank[i]] += s;
      flops[cp_rank[i]] += seq_flops[i];
    }
  }
  if (cost.whole_buffer) {  // each part one sequence of its length (cost_model.hpp)
    for (int32_t j = 0; j < cp; ++j) flops[j] = cost.local_flops(tokens[j], flops[j]);
    dist_flops = cost.dist_flops(dist_tokens, dist_flops, cp);
  }
  int64_t most = 0;
  for (int32_t j = 0; j < cp; ++j) most = std::max(most, tokens[j] + dist_shard);
  const double time = cost.micro_batch_us(flops, dist_flops, comm_bytes, most);
  for (int32_t j = 0; j < cp; ++j) {
    tokens[j] += dist_shard;
    flops[j] += dist_flops;
  }
  return time;
}

inline void score_placement(const int64_t* lengths, const double* seq_flops, size_t n, const CostModel& cost,
                            int32_t cp, DacpResult& r) {
  r.time_us = score_into(lengths, seq_flops, r.cp_rank.data(), n, cost, cp, r.rank_tokens, r.rank_flops, r.comm_bytes);
}
inline void score_placement(const int64_t* lengths, size_t n, const CostModel& cost, int32_t cp, DacpResult& r) {
  std::vector<double> seq_flops;
  detail::sequence_flops(lengths, n, cost, seq_flops);
  score_placement(lengths, seq_flops.data(), n, cost, cp, r);
}

// Scores a given placement (cp_rank[i] in [0, cp) or kDistributed) and marks
// it unschedulable when a rank would hold more than `bucket` tokens. Throws
// std::invalid_argument for arguments outside validate.hpp's ranges.
inline DacpResult evaluate_placement(const std::vector<int64_t>& lengths, const std::vector<int32_t>& cp_rank,
                                     const CostModel& cost, int32_t cp, int64_t bucket) {
  validate_micro_batch(lengths, cost, cp, bucket);
  validate_placement(cp_rank, lengths.size(), cp);
  DacpResult r;
  r.cp_rank = cp_rank;
  score_placement(lengths.data(), lengths.size(), cost, cp, r);
  for (int64_t t : r.rank_tokens)
    if (t > bucket) r.status = Status::kUnschedulable;
  return r;
}

// Corrected Algorithm 1 (or worst-fit Algorithm 4) on one micro-batch,
// writing each sequence's placement into cp_rank (caller's order).
//
// Sequences are taken shortest first. A sequence goes whole onto the
// least-loaded rank if it fits there, else onto the rank with most room
// (worst-fit skips the first try); else it is sharded if every rank has room
// for its shard; else a local sequence on the fullest rank is turned into a
// distributed one (its tokens freed on that rank, its shard charged to all)
// and the sequence is tried again. Each roll-back turns one local sequence
// into a distributed one for good, so there are at most n of them, and the
// retry loop below runs at most 2n times in all (each pass places the
// sequence, rolls one back, or returns). RollbackIndex finds each roll-back's
// candidate in amortised O(log n) and each pass costs O(cp) more, so a
// micro-batch of n sequences costs O(n (cp + log n)) however it rolls back.
//
// With `refine`, a feasible placement is then improved by refine_placement
// (refine.hpp); `moves` counts its moves.
//
// Returns kUnschedulable (placement partial) when memory cannot hold it.
inline Status dacp_into(const int64_t* lengths, const double* seq_flops, size_t n, const CostModel& cost, int32_t cp,
                        int64_t bucket, Placement placement, Rollback rollback, bool refine, Workspace& ws, int32_t* cp_rank,
                        int32_t& rollbacks, int32_t& moves) {
  std::fill(cp_rank, cp_rank + n, kDistributed);
  ws.room.assign(cp, bucket);
  ws.load.assign(cp, 0.0);
  detail::ascending_order(lengths, n, ws.order);
  std::vector<int64_t>& room = ws.room;
  std::vector<double>& load = ws.load;
  const std::vector<int32_t>& order = ws.order;
  RollbackIndex& index = ws.rollback_index;
  index.built = false;

  auto place_local = [&](int32_t k, int32_t t) {
    if (index.built) index.add(t, k);
    cp_rank[k] = t;
    room[t] -= lengths[k];
    load[t] += seq_flops[k];
  };
  auto distribute = [&](int32_t k) {
    const int64_t shard = shard_tokens(lengths[k], cp);
    const double share = seq_flops[k] / cp;
    cp_rank[k] = kDistributed;
    for (int32_t j = 0; j < cp; ++j) {
      room[j] -= shard;
      load[j] += share;
    }
  };

  for (size_t pos = 0; pos < n; ++pos) {
    const int32_t k = order[pos];
    const int64_t s = lengths[k];
    for (;;) {
      if (placement == Placement::kLeastLoad) {
        const int32_t t = detail::argmin(load);
        if (room[t] >= s) {
          place_local(k, t);
          break;
        }
      }
      const int32_t roomiest = detail::argmax(room);
      if (room[roomiest] >= s) {
        place_local(k, roomiest);
        break;
      }
      if (cp > 1 && *std::min_element(room.begin(), room.end()) >= shard_tokens(s, cp)) {
        distribute(k);
        break;
      }
      // Roll back: on the fullest rank, turn a local sequence into a
      // distributed one. It must free memory there (longer than its shard)
      // and its shard must fit on every other rank. Local sequences of a
      // rank, in placement order, are those already processed that sit there
      // (rollback_index.hpp finds the one the rule picks).
      if (cp <= 1) return Status::kUnschedulable;
      const int32_t t = detail::argmin(room);
      int64_t min_other = kMaxBucketSize;
      for (int32_t j = 0; j < cp; ++j)
        if (j != t) min_other = std::min(min_other, room[j]);
      if (!index.built) index.build(order.data(), pos, cp_rank, cp);
      const int32_t pick = index.pick(t, min_other, rollback, lengths, cp_rank, cp);
      if (pick < 0) return Status::kUnschedulable;
      room[t] += lengths[pick];
      load[t] -= seq_flops[pick];
      distribute(pick);
      ++rollbacks;
    }
  }
  if (refine) moves += refine_placement(lengths, seq_flops, n, cost, cp, bucket, order, ws, cp_rank);
  return Status::kOk;
}

// One micro-batch, checked: throws std::invalid_argument for arguments
// outside validate.hpp's ranges (dacp_into assumes them).
inline DacpResult dacp(const std::vector<int64_t>& lengths, const CostModel& cost, int32_t cp, int64_t bucket,
                       Placement placement, Rollback rollback, bool refine = false) {
  validate_micro_batch(lengths, cost, cp, bucket);
  validate_placement_rule(placement, rollback);
  Workspace ws;
  std::vector<double> seq_flops;
  detail::sequence_flops(lengths.data(), lengths.size(), cost, seq_flops);
  DacpResult r;
  r.cp_rank.resize(lengths.size());
  r.status = dacp_into(lengths.data(), seq_flops.data(), lengths.size(), cost, cp, bucket, placement, rollback, refine,
                       ws, r.cp_rank.data(), r.rollbacks, r.moves);
  score_placement(lengths.data(), seq_flops.data(), lengths.size(), cost, cp, r);
  return r;
}

}  // namespace skrull
