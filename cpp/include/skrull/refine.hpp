// Time-driven refinement of a DACP placement (this project's addition).
//
// Algorithm 1 balances memory first: a sequence long enough for attention's
// quadratic term to dominate, yet short enough to fit one rank, stays local
// and makes that rank the micro-batch's bottleneck while the others idle.
// Sharding it costs K/V traffic that the other ranks' local work hides, and
// moving it to a lighter rank costs nothing. This local search takes, on the
// bottleneck rank, the longest local sequence whose move or sharding lowers
// the predicted time (the better of the two), applies it, and repeats; it
// stops when no such sequence exists or after min(n, kMaxRefineMoves)
// moves. Memory stays within the bucket on every rank.
//
// Bounded time: each move scans the n sequences once (O(n + cp)), so the
// move cap makes a micro-batch's refinement O(kMaxRefineMoves (n + cp)).
// With n moves instead, lengths 1..50,000 in one micro-batch took 2.3 s
// (13,463 moves); real batches need far fewer (47 at most in one
// micro-batch over 400 batches of 5 length files at DP x CP = 4x8, 1x8,
// 2x16, 128x8), so the cap leaves their plans unchanged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"
#include "skrull/workspace.hpp"

namespace skrull {

// Most refinement moves in one micro-batch (see the bound above).
constexpr int32_t kMaxRefineMoves = 256;

// Refines cp_rank (a feasible placement of n sequences, caller's order) in
// place. `order` lists the sequences ascending by length (ties by index);
// seq_flops[i] = cost.flops(lengths[i]).
// Returns the number of moves made.
//
// A rank's local FLOPs and the distributed share are kept as the cost model
// prices them (cost.local_flops / dist_flops of the tokens and the
// per-document sums): per document, what a move adds or takes away; under
// whole_buffer, flops() of the part's tokens after the move.
inline int32_t refine_placement(const int64_t* lengths, const double* seq_flops, size_t n, const CostModel& cost,
                                int32_t cp, int64_t bucket, const std::vector<int32_t>& order, Workspace& ws,
                                int32_t* cp_rank) {
  if (cp <= 1 || n == 0) return 0;
  std::vector<int64_t>& room = ws.room;
  std::vector<double>& local = ws.load;  // local FLOPs per rank, as priced
  std::vector<int64_t>& ltok = ws.local_tokens;  // local tokens per rank
  room.assign(cp, bucket);
  local.assign(cp, 0.0);
  ltok.assign(cp, 0);
  const double* fl = seq_flops;
  double dist = 0.0;  // one rank's distributed FLOPs, as priced
  int64_t dtok = 0;   // the sharded sequences' tokens
  double bytes = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (cp_rank[i] == kDistributed) {
      const int64_t shard = shard_tokens(lengths[i], cp);
      for (int32_t j = 0; j < cp; ++j) room[j] -= shard;
      dist += fl[i] / cp;
      dtok += lengths[i];
      bytes += cost.kv_bytes(shard * cp);
    } else {
      room[cp_rank[i]] -= lengths[i];
      local[cp_rank[i]] += fl[i];
      ltok[cp_rank[i]] += lengths[i];
    }
  }
  if (cost.whole_buffer) {
    for (int32_t j = 0; j < cp; ++j) local[j] = cost.local_flops(ltok[j], local[j]);
    dist = cost.dist_flops(dtok, dist, cp);
  }
  int32_t moves = 0;
  double current = cost.micro_batch_us(local, dist, bytes);
  // Time of the micro-batch when the largest local FLOPs is `top`:
  // micro_batch_us's max over ranks is reached at the rank with the most
  // local FLOPs (rounding is monotone), so this equals it bit for bit.
  // comm_t is the exchange's time and dist_f the distributed part's FLOPs,
  // which a move to another rank leaves as they are.
  auto time_with = [&](double top, double dist_f, double comm_t) {
    return cost.layers_us(comm_t, top, dist_f);
  };
  const int32_t max_moves = static_cast<int32_t>(std::min<size_t>(n, kMaxRefineMoves));
  while (moves < max_moves) {
    // The bottleneck: the rank whose local work is longest. If the exchange
    // outlasts it on the device, more sharding or moving cannot help.
    int32_t b = 0;
    for (int32_t j = 1; j < cp; ++j)
      if (local[j] > local[b]) b = j;
    if (cost.line_us(local[b]) <= cost.comm_us(bytes)) break;
    int32_t lightest = b == 0 ? 1 : 0;
    for (int32_t j = 0; j < cp; ++j)
      if (j != b && local[j] < local[lightest]) lightest = j;
    double second = 0.0, third = 0.0;  // largest local FLOPs besides b; besides b and lightest
    for (int32_t j = 0; j < cp; ++j) {
      if (j == b) continue;
      second = std::max(second, local[j]);
      if (j != lightest) third = std::max(third, local[j]);
    }

    const double comm_t = cost.comm_us(bytes);
    bool moved = false;
    for (size_t c = n; c-- > 0 && !moved;) {
      const int32_t x = order[c];
      if (cp_rank[x] != b) continue;
      const int64_t s = lengths[x];
      const double f = fl[x];
      double best = current;
      int32_t to = b;  // b = no move
      const double b_after = cost.local_flops(ltok[b] - s, local[b] - f);
      const double to_after = cost.local_flops(ltok[lightest] + s, local[lightest] + f);
      const double dist_after = cost.dist_flops(dtok + s, dist + f / cp, cp);
      // Move it whole to the lightest rank.
      if (room[lightest] >= s) {
        const double t = time_with(std::max({b_after, to_after, third}), dist, comm_t);
        if (t < best) {
          best = t;
          to = lightest;
        }
      }
      // Shard it over the group.
      const int64_t shard = shard_tokens(s, cp);
      bool fits = room[b] + s >= shard;
      for (int32_t j = 0; j < cp && fits; ++j) fits = j == b || room[j] >= shard;
      if (fits) {
        const double t = time_with(std::max(b_after, second), dist_after,
                                   cost.comm_us(bytes + cost.kv_bytes(shard * cp)));
        if (t < best) {
          best = t;
          to = kDistributed;
        }
      }
      if (to == b) continue;
      local[b] = b_after;
      ltok[b] -= s;
      room[b] += s;
      if (to == kDistributed) {
        for (int32_t j = 0; j < cp; ++j) room[j] -= shard;
        dist = dist_after;
        dtok += s;
        bytes += cost.kv_bytes(shard * cp);
      } else {
        local[to] = to_after;
        ltok[to] += s;
        room[to] -= s;
      }
      cp_rank[x] = to;
      current = best;
      ++moves;
      moved = true;
    }
    if (!moved) break;
  }
  return moves;
}

}  // namespace skrull
