// A step's time estimated in O(1) from a few sums (docs/design/lookahead.md,
// "Screening"): what the look-ahead ranks candidate groupings and swaps by,
// so that only a few are planned in full. It is a screen, not a price: every
// grouping the look-ahead keeps is priced by the full step planner.
//
// The estimate is the classic lower bound of a step on P = dp CP groups, in
// time units of one CP group, plus what every rank pays per micro-batch:
//   work  = max(sum c / P, c_1, c_P + c_{P+1})      (LPT's bound on P machines)
//   m     = ceil(tokens / (P cp C)), at least 1       (micro-batches a rank needs)
//   step  = max(work + m (micro_batch_fixed_us + layers b_us), m (micro_batch_fixed_us + layers floor))
//           + token_us tokens / (P cp) + step_fixed_us
// where c_i is the i-th largest sample's layers x a x FLOPs / cp (its share
// of one CP group's time, sharded or beside others) and C the BucketSize.
// The c_1 and c_P + c_{P+1} terms are what a straggler costs: the term the
// look-ahead removes by giving long samples a step of their own. A rank's m
// micro-batches make at least m calls a layer, each at least the host floor
// (cost_model.hpp floored_us): however few FLOPs they hold, they cost that.
//
// A step's chunked documents (overlength "chunk", chunked.hpp) are work items
// of a known time d_k and c_k chunk passes on one CP group, outside the
// micro-batches. Free-running (or at P = 1) they add sum d / P to the work
// and d_max to its bound (a bound that leaves them out of the c_P + c_{P+1}
// pairing: it stays a lower bound). On a lockstep timeline at P > 1 they run
// after every rank's slots, so they add to the samples' work instead of
// sharing it, and every rank runs the same n = sum_k n_k chunk passes
// (chunked.hpp), its own and pad ones, each pad at least p, the cheapest pad
// chunk (CostModel::pad_chunks_us of one, after no prefix): rank i's
// after-time is at least n p + sum over its documents of (d_k - c_k p). So
// the step's after-time is at least
//   max(d_max, max(c_max, ceil(C / P)) p + (sum d - C p) / P)
// (C = sum c_k; n >= c_max, and n >= C / P as some rank holds C / P of the
// chunks; the mean over ranks of sum (d_k - c_k p) is (sum d - C p) / P).
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
  int32_t chunk_docs = 0;   // how many
  int64_t chunk_passes = 0;  // their chunks summed (C above)
  int32_t chunk_most = 0;   // the most chunks one of them takes (c_max above)
};

class StepEstimator {
 public:
  StepEstimator(const CostModel& cost, const Options& opt)
      : groups_(std::max<int32_t>(1, opt.dp)),
        per_flop_(cost.shape.layers * cost.a_us_per_flop / std::max<int32_t>(1, opt.cp)),
        capacity_(static_cast<double>(group_capacity(opt.bucket_size, opt.cp, std::max<int32_t>(1, opt.dp)))),
        per_micro_batch_(cost.micro_batch_fixed_us + cost.shape.layers * cost.b_us),
        per_floored_micro_batch_(cost.floored_us(1.0)),
        per_token_(cost.token_us / (static_cast<double>(std::max<int32_t>(1, opt.dp)) * std::max<int32_t>(1, opt.cp))),
        step_fixed_(cost.step_fixed_us),
        lockstep_(opt.timeline == Timeline::kLockstep && opt.dp > 1),
        pad_(cost.pad_chunks_us(0, 1, std::max<int32_t>(1, opt.cp))) {}

  int32_t groups() const { return groups_; }

  // A sample's share of one CP group's time (c_i above), from its FLOPs.
  double cost(double flops) const { return per_flop_ * flops; }

  // The estimate of a step with these sums; 0 for an empty step.
  double us(const StepSketch& s) const {
    if (s.count == 0 && s.chunk_docs == 0) return 0.0;
    double work = 0.0;
    if (lockstep_) {
      const double passes = std::max<double>(s.chunk_most, std::ceil(static_cast<double>(s.chunk_passes) / groups_));
      const double after =
          s.chunk_docs == 0
              ? 0.0
              : std::max(s.chunk_max, passes * pad_ + (s.chunk_work - static_cast<double>(s.chunk_passes) * pad_) / groups_);
      work = std::max({s.work / groups_, s.c1, s.cp_ + s.cp1}) + after;
    } else {
      work = std::max({(s.work + s.chunk_work) / groups_, s.c1, s.chunk_max, s.cp_ + s.cp1});
    }
    const double m = s.count == 0 ? 0.0 : std::max(1.0, std::ceil(s.tokens / capacity_));
    return std::max(work + m * per_micro_batch_, m * per_floored_micro_batch_) + per_token_ * s.tokens + step_fixed_;
  }

  // Adds a chunked document of `us` microseconds in `chunks` passes on one CP group to `s` (any order).
  static void add_chunked(StepSketch& s, double us, int32_t chunks) {
    s.chunk_work += us;
    s.chunk_max = std::max(s.chunk_max, us);
    ++s.chunk_docs;
    s.chunk_passes += chunks;
    s.chunk_most = std::max(s.chunk_most, chunks);
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
  double per_floored_micro_batch_;  // a micro-batch whose every call a layer is at the host floor
  double per_token_;
  double step_fixed_;
  bool lockstep_;  // a lockstep timeline at P > 1: chunked documents after the slots, padded
  double pad_;     // the cheapest pad chunk (CostModel::pad_chunks_us(0, 1, cp))
};

}  // namespace skrull
