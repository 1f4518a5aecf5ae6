// Scratch buffers reused across the many DACP runs of one schedule() call,
// so the hot loops do not allocate. Owned by the caller (no global state):
// each call, or each thread, has its own.
#pragma once

#include <cstdint>
#include <vector>

#include "skrull/rollback_index.hpp"

namespace skrull {

struct Workspace {
  std::vector<int32_t> order;       // processing order of a micro-batch
  std::vector<int64_t> room;        // free tokens per CP rank
  std::vector<double> load;         // FLOPs per CP rank
  std::vector<int64_t> local_tokens; // refinement: local tokens per CP rank
  std::vector<int64_t> tokens;      // scoring: tokens per CP rank
  std::vector<double> flops;        // scoring: local FLOPs per CP rank
  std::vector<int64_t> lengths;     // lengths of the group being placed
  std::vector<double> seq_flops;    // and their FLOPs
  std::vector<int32_t> placement;   // placement of the group being placed
  std::vector<double> group_bounds; // GDS: lower bounds of a split's groups
  RollbackIndex rollback_index;     // DACP roll-back candidates
  // The shard sweep (dacp_sweep.hpp), per position in its longest-first order:
  std::vector<int32_t> sweep_order;
  std::vector<double> sweep_rest;         // FLOPs from there to the end
  std::vector<int64_t> sweep_prefix;      // tokens per rank of the shards before it
  std::vector<double> sweep_bound;        // bound of the candidate sharding those before it
  std::vector<int32_t> sweep_candidate;   // placement being scored
};

}  // namespace skrull
