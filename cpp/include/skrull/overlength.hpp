// The over-length rule, in one place for both entry points (schedule: a CP
// group holds a sequence; schedule_pool: the dp x cp world does).
//
// A sequence longer than the longest the holding ranks can hold
// (max_sequence_length(bucket_size, ranks), cost_model.hpp) meets
// opt.overlength: kError throws std::invalid_argument naming the sequence,
// the limit and the fix; kDrop leaves it out of the plan; kTruncate plans its
// first `limit` tokens. Python's data path applies the same limit
// (skrull_ext.scheduler.capacity.Capacity.limit calls max_sequence_length)
// before the core, and counts each sample (skrull_ext/data/overlength.py).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"

namespace skrull {

// What the holding ranks are, for the limit and the error: `ranks` of them
// (a CP group's cp, or the world's dp x cp), `holder` in words ("a CP group"),
// `source` the options that set it ("bucket_size 8 x cp 2") and `raise` what
// to raise ("bucket_size or cp").
struct LengthHolder {
  int64_t ranks;
  const char* holder;
  std::string source;
  const char* raise;
};

// The kept sequences of a global batch under the limit: `lengths` is the
// input with truncated ones cut to the limit; `live` the indices planned, in
// input order; `dropped` and `truncated` the indices the rule touched.
struct LengthCut {
  int64_t limit = 0;
  std::vector<int64_t> lengths;
  std::vector<int32_t> live, dropped, truncated;
};

// Applies the rule to `input` (lengths in the caller's order) for sequences
// held by `held`'s ranks with opt.bucket_size tokens each.
inline LengthCut cut_overlength(const std::vector<int64_t>& input, const Options& opt, const LengthHolder& held) {
  LengthCut out;
  out.limit = max_sequence_length(opt.bucket_size, held.ranks);
  out.lengths = input;
  out.live.reserve(input.size());
  for (int32_t k = 0; k < static_cast<int32_t>(input.size()); ++k) {
    const int64_t s = input[k];
    if (s > out.limit) {
      if (opt.overlength == Overlength::kError)
        throw std::invalid_argument("sequence " + std::to_string(k) + " has length " + std::to_string(s) +
                                    ", longer than the " + std::to_string(out.limit) + " tokens " + held.holder +
                                    " can hold (" + held.source + "); raise " + held.raise +
                                    ", or set overlength to 'truncate' or 'drop'");
      if (opt.overlength == Overlength::kDrop) {
        out.dropped.push_back(k);
        continue;
      }
      out.lengths[k] = out.limit;
      out.truncated.push_back(k);
    }
    out.live.push_back(k);
  }
  return out;
}

}  // namespace skrull
