// The C++ tests' toy cost model, shared so every hand-computed case prices
// alike: flops(s) = 24 s + 4 s^2 (shape {1, 1, 1, 1}), T_comp(F) = F, no
// fixed cost and no communication cost.
#pragma once

#include "skrull/cost_model.hpp"

namespace skrull_test {
inline skrull::CostModel toy() {
  skrull::CostModel c;
  c.shape = {1, 1, 1, 1};
  c.a_us_per_flop = 1.0;
  c.b_us = 0.0;
  c.comm.bytes = {1.0};
  c.comm.us = {0.0};
  return c;
}
}  // namespace skrull_test
