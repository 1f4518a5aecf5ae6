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
  std::vector<int64_t> tokens;      // scoring: tokens per CP rank
  std::vector<double> flops;        // scoring: local FLOPs per CP rank
  std::vector<int64_t> lengths;     // lengths of the group being placed
  std::vector<int32_t> placement;   // placement of the group being placed
  RollbackIndex rollback_index;     // DACP roll-back candidates
};

}  // namespace skrull
