// Roll-back candidates of DACP (dacp.hpp) without rescanning.
//
// DACP's roll-back turns a local sequence x of the fullest rank t into a
// distributed one. The rule (Rollback::kLongest / kShortest) picks, among
// the sequences already placed whole on t, the last / first in processing
// order (ascending length, ties by index) that
//   (a) frees memory on t: length(x) > shard(x), and
//   (b) has a shard that fits on every other rank: shard(x) <= min_other,
// where min_other is the least room of the ranks other than t.
// Scanning all processed sequences for that costs O(n) per roll-back, and a
// micro-batch can roll back O(n) times: O(n^2) in all, seconds at 40K
// sequences. This index finds the same sequence in amortised O(log n):
//
// - shard(x) is non-decreasing in length(x), so along a rank's list (which
//   is in processing order) (b) holds on a prefix; (a) holds on a suffix
//   (for cp >= 2 it is length >= 3: x - 2*ceil(x/2cp) never falls back to 0).
// - A rolled-back sequence stays distributed, so "gone from t" is permanent.
// kShortest: the first live entry passing (a) is the only candidate (any
// later one has a shard at least as large); a head pointer skips, for good,
// the gone entries and those failing (a).
// kLongest: binary-search the end of the (b) prefix, then step down to the
// nearest live entry through path-compressed jumps (each jump[i] < i and
// every entry in (jump[i], i] is gone).
//
// The index is built at a micro-batch's first roll-back (most have none) in
// O(n + cp) and kept up to date by add() afterwards.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"

namespace skrull {

struct RollbackIndex {
  std::vector<std::vector<int32_t>> local;  // per rank: sequences placed whole there, in processing order
  std::vector<std::vector<int32_t>> jump;   // per rank, per entry: where to look next when it is gone
  std::vector<size_t> head;                 // per rank (kShortest): entries below are gone or fail (a)
  bool built = false;

  // Indexes the sequences order[0, pos) that sit on a rank now.
  void build(const int32_t* order, size_t pos, const int32_t* cp_rank, int32_t cp) {
    if (local.size() < static_cast<size_t>(cp)) {
      local.resize(cp);
      jump.resize(cp);
    }
    head.assign(cp, 0);
    for (int32_t j = 0; j < cp; ++j) {
      local[j].clear();
      jump[j].clear();
    }
    for (size_t p = 0; p < pos; ++p) {
      const int32_t x = order[p];
      if (cp_rank[x] != kDistributed) add(cp_rank[x], x);
    }
    built = true;
  }

  // Sequence x was placed whole on rank t (after every indexed one).
  void add(int32_t t, int32_t x) {
    jump[t].push_back(static_cast<int32_t>(local[t].size()) - 1);
    local[t].push_back(x);
  }

  // The sequence the roll-back rule picks on rank t, or -1.
  int32_t pick(int32_t t, int64_t min_other, Rollback rule, const int64_t* lengths, const int32_t* cp_rank,
               int32_t cp) {
    const std::vector<int32_t>& list = local[t];
    auto frees = [&](int32_t x) { return lengths[x] > shard_tokens(lengths[x], cp); };
    if (rule == Rollback::kShortest) {
      size_t& h = head[t];
      while (h < list.size() && (cp_rank[list[h]] != t || !frees(list[h]))) ++h;
      if (h == list.size()) return -1;
      return shard_tokens(lengths[list[h]], cp) <= min_other ? list[h] : -1;
    }
    // Last entry whose shard fits (b), then the nearest live one at or below.
    const auto end = std::partition_point(list.begin(), list.end(), [&](int32_t x) {
      return shard_tokens(lengths[x], cp) <= min_other;
    });
    int32_t i = static_cast<int32_t>(end - list.begin()) - 1;
    std::vector<int32_t>& next = jump[t];
    int32_t live = i;
    while (live >= 0 && cp_rank[list[live]] != t) live = next[live];
    while (i >= 0 && cp_rank[list[i]] != t) {  // path compression
      const int32_t up = next[i];
      next[i] = live;
      i = up;
    }
    return live >= 0 && frees(list[live]) ? list[live] : -1;
  }
};

}  // namespace skrull
