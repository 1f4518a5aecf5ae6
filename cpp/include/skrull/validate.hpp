// Input checks of the public entry points (schedule, schedule_pool,
// lookahead, dacp, evaluate_placement): every value outside the accepted ranges of types.hpp
// and CostModel::validate() is refused with std::invalid_argument naming it
// and its limit, so the algorithms below may assume them (docs/reliability.md
// shows why nothing then overflows). No asserts: bad input is the caller's
// error, reported, never a crash.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"

namespace skrull {

namespace detail {

[[noreturn]] inline void fail(const std::string& what) { throw std::invalid_argument(what); }

inline void check_in(const char* name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    fail(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
         std::to_string(v));
}

}  // namespace detail

inline void validate_placement_rule(Placement placement, Rollback rollback) {
  const auto p = static_cast<int32_t>(placement);
  const auto r = static_cast<int32_t>(rollback);
  if (p < 0 || p > 1) detail::fail("unknown placement " + std::to_string(p));
  if (r < 0 || r > 1) detail::fail("unknown rollback " + std::to_string(r));
}

// Throws std::invalid_argument naming the bad option and its limit.
inline void validate_options(const Options& opt) {
  detail::check_in("dp", opt.dp, 1, kMaxRanks);
  detail::check_in("cp", opt.cp, 1, kMaxRanks);
  detail::check_in("bucket_size", opt.bucket_size, 1, kMaxBucketSize);
  detail::check_in("max_extra_micro_batches", opt.max_extra_micro_batches, 0, 1024);
  validate_placement_rule(opt.placement, opt.rollback);
  const auto mbc = static_cast<int32_t>(opt.micro_batch_count);
  const auto ovl = static_cast<int32_t>(opt.overlength);
  const auto search = static_cast<int32_t>(opt.dacp_search);
  if (mbc < 0 || mbc > 1) detail::fail("unknown micro_batch_count " + std::to_string(mbc));
  if (!(opt.sweep_margin >= 0.0 && opt.sweep_margin <= 100.0))
    detail::fail("sweep_margin must be in [0, 100], got " + std::to_string(opt.sweep_margin));
  if (search < 0 || search > 1) detail::fail("unknown dacp_search " + std::to_string(search));
  if (ovl < 0 || ovl > 2) detail::fail("unknown overlength " + std::to_string(ovl));
  if (!(opt.pool_widen >= 0.0 && opt.pool_widen <= 1e6))
    detail::fail("pool_widen must be in [0, 1e6], got " + std::to_string(opt.pool_widen));
  const int32_t timeline = static_cast<int32_t>(opt.timeline);
  if (timeline < 0 || timeline > 1) detail::fail("unknown timeline " + std::to_string(timeline));
}

// At most kMaxSequences lengths, each in [1, kMaxLength]. `what` names the
// batch in the message ("global batch", "micro-batch").
inline void validate_lengths(const std::vector<int64_t>& lengths, const char* what) {
  if (static_cast<int64_t>(lengths.size()) > kMaxSequences)
    detail::fail(std::string(what) + " has " + std::to_string(lengths.size()) + " sequences, more than the limit " +
                 std::to_string(kMaxSequences));
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1 || lengths[i] > kMaxLength)
      detail::fail("sequence " + std::to_string(i) + " has length " + std::to_string(lengths[i]) + ", outside [1, " +
                   std::to_string(kMaxLength) + "]");
}

// One CP group: cp ranks of `bucket` tokens each.
inline void validate_group(int32_t cp, int64_t bucket) {
  detail::check_in("cp", cp, 1, kMaxRanks);
  detail::check_in("bucket_size", bucket, 1, kMaxBucketSize);
}

// Arguments of one micro-batch on one CP group (dacp, evaluate_placement).
inline void validate_micro_batch(const std::vector<int64_t>& lengths, const CostModel& cost, int32_t cp,
                                 int64_t bucket) {
  validate_group(cp, bucket);
  cost.validate();
  validate_lengths(lengths, "micro-batch");
}

// A placement of n sequences: each a CP rank in [0, cp) or kDistributed.
inline void validate_placement(const std::vector<int32_t>& cp_rank, size_t n, int32_t cp) {
  if (cp_rank.size() != n)
    detail::fail("cp_rank has " + std::to_string(cp_rank.size()) + " entries for " + std::to_string(n) +
                 " sequences");
  for (size_t i = 0; i < n; ++i)
    if (cp_rank[i] != kDistributed && (cp_rank[i] < 0 || cp_rank[i] >= cp))
      detail::fail("cp_rank[" + std::to_string(i) + "] = " + std::to_string(cp_rank[i]) +
                   " is neither DISTRIBUTED (-1) nor in [0, " + std::to_string(cp) + ")");
}

}  // namespace skrull
