// Chunked documents in a step's plan (overlength "chunk", docs/design/chunked.md).
//
// A document longer than a CP group holds is trained whole, in chunks, by one
// DP rank's whole CP group after that rank's micro-batches
// (skrull_ext/train/chunked.py). To the scheduler it is one work item of a
// known time (skrull_ext/scheduler/chunk_cost.py prices it on the cost model:
// its chunks' attention over their prefix, the recomputed forward, the K/V
// exchange) that cannot be split: which DP rank runs it is the only choice.
//
// assign_chunked (gds.hpp, beside split_over_dp, whose LPT it shares): LPT
// over the DP ranks, longest first (ties by index), each to the rank with the
// least chunked time so far (ties to the lower rank).
// GDS then splits the planned samples around that load (split_over_dp starts
// each rank at its chunked time in FLOP units, chunked_flops), so a rank
// holding a long document takes fewer of the short ones. Pure functions of
// their inputs: every rank gets the same assignment.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "skrull/cost_model.hpp"

namespace skrull {

// Throws std::invalid_argument unless every time is finite and >= 0.
inline void validate_chunked(const std::vector<double>& chunked_us) {
  for (size_t k = 0; k < chunked_us.size(); ++k)
    if (!(std::isfinite(chunked_us[k]) && chunked_us[k] >= 0.0))
      throw std::invalid_argument("chunked document " + std::to_string(k) + " has time " +
                                  std::to_string(chunked_us[k]) + " us; must be finite and >= 0");
}

// Per DP rank: the summed time of the chunked documents it runs.
inline std::vector<double> chunked_load(const std::vector<double>& chunked_us, const std::vector<int32_t>& rank,
                                        int32_t dp) {
  std::vector<double> out(dp, 0.0);
  for (size_t k = 0; k < chunked_us.size(); ++k) out[rank[k]] += chunked_us[k];
  return out;
}

// A rank's chunked time in the unit split_over_dp balances (per-layer forward
// FLOPs of one sequence): the FLOPs whose compute takes that long sharded
// over the CP group, layers x a x FLOPs / cp.
inline std::vector<double> chunked_flops(const std::vector<double>& load_us, const CostModel& cost, int32_t cp) {
  std::vector<double> out(load_us.size(), 0.0);
  const double per_flop = cost.shape.layers * cost.a_us_per_flop / cp;
  if (per_flop > 0.0)
    for (size_t i = 0; i < load_us.size(); ++i) out[i] = load_us[i] / per_flop;
  return out;
}

}  // namespace skrull
