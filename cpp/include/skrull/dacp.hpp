// DACP (SKRULL.md, corrected Algorithm 1, and the paper's worst-fit
// Algorithm 4): for one micro-batch on one CP group, decide which sequences
// stay whole on one CP rank and which are sharded over the group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"

namespace skrull {

namespace detail {

// Lowest index of the smallest / largest element: ties go to the lower rank
// so every rank computes the same plan.
template <typename T>
int32_t argmin(const std::vector<T>& v) {
  return static_cast<int32_t>(std::min_element(v.begin(), v.end()) - v.begin());
}
template <typename T>
int32_t argmax(const std::vector<T>& v) {
  // max_element returns the first largest.
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Ascending by length, ties by index: the processing order of Algorithm 1.
inline std::vector<int32_t> ascending_order(const int64_t* lengths, size_t n) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [lengths](int32_t a, int32_t b) {
    return lengths[a] != lengths[b] ? lengths[a] < lengths[b] : a < b;
  });
  return order;
}

}  // namespace detail

// Fills tokens, FLOPs, bytes and predicted time of a placement. The single
// place where a placement is turned into figures: the heuristics, the exact
// solver's answers and the simulator's baselines are all scored here.
inline void score_placement(const int64_t* lengths, size_t n, const CostModel& cost, int32_t cp, DacpResult& r) {
  r.rank_tokens.assign(cp, 0);
  r.rank_flops.assign(cp, 0.0);
  r.comm_bytes = 0.0;
  double dist_flops = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = lengths[i];
    if (r.cp_rank[i] == kDistributed) {
      const int64_t shard = shard_tokens(s, cp);
      for (int32_t j = 0; j < cp; ++j) r.rank_tokens[j] += shard;
      dist_flops += cost.flops(s) / cp;
      r.comm_bytes += cost.kv_bytes(shard * cp);
    } else {
      r.rank_tokens[r.cp_rank[i]] += s;
      r.rank_flops[r.cp_rank[i]] += cost.flops(s);
    }
  }
  r.time_us = cost.micro_batch_us(r.rank_flops, dist_flops, r.comm_bytes);
  for (int32_t j = 0; j < cp; ++j) r.rank_flops[j] += dist_flops;
}

// Scores a given placement (cp_rank[i] in [0, cp) or kDistributed) and marks
// it unschedulable when a rank would hold more than `bucket` tokens.
inline DacpResult evaluate_placement(const std::vector<int64_t>& lengths, const std::vector<int32_t>& cp_rank,
                                     const CostModel& cost, int32_t cp, int64_t bucket) {
  DacpResult r;
  r.cp_rank = cp_rank;
  score_placement(lengths.data(), lengths.size(), cost, cp, r);
  for (int64_t t : r.rank_tokens)
    if (t > bucket) r.status = Status::kUnschedulable;
  return r;
}

// Corrected Algorithm 1 (or worst-fit Algorithm 4) on one micro-batch.
//
// Sequences are taken shortest first. A sequence goes whole onto the
// least-loaded rank if it fits there, else onto the rank with most room
// (worst-fit skips the first try); else it is sharded if every rank has room
// for its shard; else a local sequence on the fullest rank is turned into a
// distributed one (its tokens freed on that rank, its shard charged to all)
// and the sequence is tried again. Each roll-back turns one local sequence
// into a distributed one for good, so there are at most n of them.
//
// Returns placements in the caller's order. status is kUnschedulable (and
// the placement partial) when memory cannot hold the micro-batch.
inline DacpResult dacp(const int64_t* lengths, size_t n, const CostModel& cost, int32_t cp, int64_t bucket,
                       Placement placement, Rollback rollback) {
  DacpResult r;
  r.cp_rank.assign(n, kDistributed);
  std::vector<int64_t> room(cp, bucket);
  std::vector<double> load(cp, 0.0);
  std::vector<std::vector<int32_t>> local(cp);  // per rank, in placement order (ascending length)
  const std::vector<int32_t> order = detail::ascending_order(lengths, n);

  auto place_local = [&](int32_t k, int32_t t) {
    r.cp_rank[k] = t;
    room[t] -= lengths[k];
    load[t] += cost.flops(lengths[k]);
    local[t].push_back(k);
  };
  auto fits_everywhere = [&](int64_t shard) {
    return *std::min_element(room.begin(), room.end()) >= shard;
  };
  auto distribute = [&](int32_t k) {
    const int64_t shard = shard_tokens(lengths[k], cp);
    const double share = cost.flops(lengths[k]) / cp;
    r.cp_rank[k] = kDistributed;
    for (int32_t j = 0; j < cp; ++j) {
      room[j] -= shard;
      load[j] += share;
    }
  };

  for (int32_t k : order) {
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
      if (cp > 1 && fits_everywhere(shard_tokens(s, cp))) {
        distribute(k);
        break;
      }
      // Roll back: on the fullest rank, turn a local sequence into a
      // distributed one. It must free memory there (longer than its shard)
      // and its shard must fit on every other rank.
      const int32_t t = detail::argmin(room);
      std::vector<int32_t>& on_t = local[t];
      int32_t pick = -1;
      for (size_t c = 0; c < on_t.size(); ++c) {
        const size_t i = rollback == Rollback::kLongest ? on_t.size() - 1 - c : c;
        const int32_t x = on_t[i];
        const int64_t shard = shard_tokens(lengths[x], cp);
        if (cp <= 1 || lengths[x] <= shard) continue;
        bool fits = true;
        for (int32_t j = 0; j < cp && fits; ++j) fits = j == t || room[j] >= shard;
        if (fits) {
          pick = static_cast<int32_t>(i);
          break;
        }
      }
      if (pick < 0) {
        r.status = Status::kUnschedulable;
        r.cp_rank[k] = kDistributed;
        score_placement(lengths, n, cost, cp, r);
        return r;
      }
      const int32_t x = on_t[pick];
      on_t.erase(on_t.begin() + pick);
      room[t] += lengths[x];
      load[t] -= cost.flops(lengths[x]);
      distribute(x);
      ++r.rollbacks;
    }
  }
  score_placement(lengths, n, cost, cp, r);
  return r;
}

inline DacpResult dacp(const std::vector<int64_t>& lengths, const CostModel& cost, int32_t cp, int64_t bucket,
                       Placement placement, Rollback rollback) {
  return dacp(lengths.data(), lengths.size(), cost, cp, bucket, placement, rollback);
}

}  // namespace skrull
