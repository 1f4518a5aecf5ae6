// A step's time estimated in O(1) from a few sums (docs/design/lookahead.md,
// "Screening"): what the look-ahead ranks candidate groupings and swaps by,
// so that only a few are planned in full. It is a screen, not a price: every
// grouping the look-ahead keeps is priced by the full step planner.
//
// The estimate is the classic lower bound of a step on P = dp CP groups, in
// time units of one CP group, plus what every rank pays per micro-batch:
//   work  = max(sum c / P, c_1, c_P + c_{P+1})      (LPT's bound on P machines)
//   m     = ceil(tokens / (P cp C)), at least 1       (micro-batches a rank needs)
//   step  = work + m (micro_batch_fixed_us + layers b_us) + token_us tokens / (P cp) + step_fixed_us
// where c_i is the i-th largest sample's layers x a x FLOPs / cp (its share
// of one CP group's time, sharded or beside others) and C the BucketSize.
// The c_1 and c_P + c_{P+1} terms are what a straggler costs: the term the
// look-ahead removes by giving long samples a step of their own.
//
// A step's chunked documents (overlength "chunk", chunked.hpp) are work items
// of a known time d_k on one CP group, outside the micro-batches: they add
// sum d / P to the work and d_max to its bound (a bound that leaves them out
// of the c_P + c_{P+1} pairing: it stays a lower bound).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"

namespace skrull {

// The sums of one step's samples the estimate needs.
struct StepSketch {
  int32_t count = 0;    // samples
  double work = 0.0;    // sum of their costs (StepEstimator::cost)
  double tokens = 0.0;  // sum of their lengths
  double c1 = 0.0;      // largest cost
  double cp_ = 0.0;     // P-th largest cost (0 below P samples)
  double cp1 = 0.0;     // (P+1)-th largest cost (0 below P+1 samples)
  double chunk_work = 0.0;  // sum of its chunked documents' times
  double chunk_max = 0.0;   // the longest of them
};

class StepEstimator {
 public:
  StepEstimator(const CostModel& cost, const Options& opt)
      : groups_(std::max<int32_t>(1, opt.dp)),
        per_flop_(cost.shape.layers * cost.a_us_per_flop / std::max<int32_t>(1, opt.cp)),
        capacity_(static_cast<double>(group_capacity(opt.bucket_size, opt.cp, std::max<int32_t>(1, opt.dp)))),
        per_micro_batch_(cost.micro_batch_fixed_us + cost.shape.layers * cost.b_us),
        per_token_(cost.token_us / (static_cast<double>(std::max<int32_t>(1, opt.dp)) * std::max<int32_t>(1, opt.cp))),
        step_fixed_(cost.step_fixed_us) {}

  int32_t groups() const { return groups_; }

  // A sample's share of one CP group's time (c_i above), from its FLOPs.
  double cost(double flops) const { return per_flop_ * flops; }

  // The estimate of a step with these sums; 0 for an empty step.
  double us(const StepSketch& s) const {
    if (s.count == 0 && s.chunk_max == 0.0) return 0.0;
    const double work = std::max({(s.work + s.chunk_work) / groups_, s.c1, s.chunk_max, s.cp_ + s.cp1});
    const double m = s.count == 0 ? 0.0 : std::max(1.0, std::ceil(s.tokens / capacity_));
    return work + m * per_micro_batch_ + per_token_ * s.tokens + step_fixed_;
  }

  // Adds a chunked document of `us` microseconds on one CP group to `s` (any order).
  static void add_chunked(StepSketch& s, double us) {
    s.chunk_work += us;
    s.chunk_max = std::max(s.chunk_max, us);
  }

  // Adds a sample to `s`; samples must come largest cost first (the order
  // fixes which are c_1, c_P and c_{P+1}).
  void add_descending(StepSketch& s, double c, int64_t length) const {
    ++s.count;
    s.work += c;
    s.tokens += static_cast<double>(length);
    if (s.count == 1) s.c1 = c;
    if (s.count == groups_) s.cp_ = c;
    if (s.count == groups_ + 1) s.cp1 = c;
  }

 private:
  int32_t groups_;
  double per_flop_;
  double capacity_;
  double per_micro_batch_;
  double per_token_;
  double step_fixed_;
};

}  // namespace skrull
