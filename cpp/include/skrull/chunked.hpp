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
//
// Lockstep DP ranks (timeline.hpp) share FSDP's collectives in every chunk
// pass, so every rank runs as many chunk passes at each position as the
// others (skrull_ext/train/passes.py runs what lockstep_passes and
// lockstep_pads say): for k in 0..(the most documents one rank holds),
// n_k = the most chunks any rank's k-th document (in the documents' order)
// takes; a rank pads its k-th document to n_k passes, or runs an all-pad
// document of n_k where it holds none. A pad chunk runs what any chunk of
// its document does (CostModel::pad_chunks_us: one token a CP rank, its K/V
// gathered over the group, recomputed but at its position's last pass, its
// queries over the document's tokens before it), and chunked_after counts
// the pads' price (lockstep_pad_us) in the work a rank runs after its
// micro-batches: the assignment, the step's time and the look-ahead's
// estimate all see them. Free-running ranks (or one DP rank) pad nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/types.hpp"

namespace skrull {

// Accepted ranges of a step's chunked documents (validate_chunked). A document's
// price is its chunk passes on the cost model, each below a micro-batch's bound
// (about 5.1e42 us, docs/reliability.md) and at most 2^36 of them, so below
// kMaxChunkedUs; with at most kMaxSequences documents a rank's sum stays finite
// (below 2e67 us). Every pass count (a position's, a rank's pads, lockstep_pads)
// is at most the step's chunk passes in all, which kMaxChunkPasses keeps within
// int32 (the pads' type): without it two documents of 2^31 - 1 chunks on one DP
// rank made the other's pads wrap to -2 (a crafted input for the fuzz target's
// pad check).
constexpr double kMaxChunkedUs = 1e60;
constexpr int64_t kMaxChunkPasses = int64_t{1} << 30;

// A step's chunked documents as the planners take them, in the step's order:
// each one's predicted time on one CP group, its chunk passes
// (skrull_ext/train/chunked.py: ceil(length / chunk)), its length in tokens
// (where its lockstep pad chunks start) and the tokens of its last chunk
// (recomputed where pads follow it): lockstep_pad_us.
struct ChunkedDocs {
  std::vector<double> us;
  std::vector<int32_t> chunks;
  std::vector<int64_t> lengths;
  std::vector<int64_t> last_chunk;
  size_t size() const { return us.size(); }
  bool empty() const { return us.empty(); }
};

// Throws std::invalid_argument unless every time is finite and >= 0.
inline void validate_chunked(const std::vector<double>& chunked_us) {
  for (size_t k = 0; k < chunked_us.size(); ++k)
    if (!(std::isfinite(chunked_us[k]) && chunked_us[k] >= 0.0))
      throw std::invalid_argument("chunked document " + std::to_string(k) + " has time " +
                                  std::to_string(chunked_us[k]) + " us; must be finite and >= 0");
}

// One chunk count of at least 1 per document, kMaxChunkPasses in all.
inline void validate_chunk_counts(const std::vector<int32_t>& chunks, size_t documents) {
  if (chunks.size() != documents)
    throw std::invalid_argument(std::to_string(chunks.size()) + " chunk counts for " + std::to_string(documents) +
                                " chunked documents");
  int64_t passes = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (chunks[k] < 1)
      throw std::invalid_argument("chunked document " + std::to_string(k) + " has " + std::to_string(chunks[k]) +
                                  " chunks; must be >= 1");
    passes += chunks[k];
  }
  if (passes > kMaxChunkPasses)
    throw std::invalid_argument("chunked documents have " + std::to_string(passes) +
                                " chunk passes in all, more than the limit " + std::to_string(kMaxChunkPasses));
}

// As above, each time at most kMaxChunkedUs, at most kMaxSequences documents,
// validate_chunk_counts, one length in [1, kMaxLength] per document and one
// last chunk in [1, its length].
inline void validate_chunked(const ChunkedDocs& docs) {
  validate_chunked(docs.us);
  if (static_cast<int64_t>(docs.us.size()) > kMaxSequences)
    throw std::invalid_argument(std::to_string(docs.us.size()) + " chunked documents, more than the limit " +
                                std::to_string(kMaxSequences));
  for (size_t k = 0; k < docs.us.size(); ++k)
    if (docs.us[k] > kMaxChunkedUs) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "chunked document %zu has time %g us, above the limit %g us", k, docs.us[k],
                    kMaxChunkedUs);
      throw std::invalid_argument(buf);
    }
  validate_chunk_counts(docs.chunks, docs.us.size());
  if (docs.lengths.size() != docs.us.size())
    throw std::invalid_argument(std::to_string(docs.lengths.size()) + " chunked lengths for " +
                                std::to_string(docs.us.size()) + " chunked documents");
  for (size_t k = 0; k < docs.lengths.size(); ++k)
    if (docs.lengths[k] < 1 || docs.lengths[k] > kMaxLength)
      throw std::invalid_argument("chunked document " + std::to_string(k) + " has length " +
                                  std::to_string(docs.lengths[k]) + "; must be in [1, " + std::to_string(kMaxLength) +
                                  "]");
  if (docs.last_chunk.size() != docs.us.size())
    throw std::invalid_argument(std::to_string(docs.last_chunk.size()) + " last chunks for " +
                                std::to_string(docs.us.size()) + " chunked documents");
  for (size_t k = 0; k < docs.last_chunk.size(); ++k)
    if (docs.last_chunk[k] < 1 || docs.last_chunk[k] > docs.lengths[k])
      throw std::invalid_argument("chunked document " + std::to_string(k) + " has a last chunk of " +
                                  std::to_string(docs.last_chunk[k]) + " tokens; must be in [1, " +
                                  std::to_string(docs.lengths[k]) + "]");
}

// Throws std::invalid_argument unless each document's rank is in [0, dp).
inline void validate_chunked_ranks(const std::vector<int32_t>& rank, size_t documents, int32_t dp) {
  if (rank.size() != documents)
    throw std::invalid_argument(std::to_string(rank.size()) + " DP ranks for " + std::to_string(documents) +
                                " chunked documents");
  for (size_t k = 0; k < rank.size(); ++k)
    if (rank[k] < 0 || rank[k] >= dp)
      throw std::invalid_argument("chunked document " + std::to_string(k) + "'s DP rank " +
                                  std::to_string(rank[k]) + " is outside [0, " + std::to_string(dp) + ")");
}

// Lockstep: n_k for each position k, the most chunks any DP rank's k-th
// document takes (`rank`: each document's DP rank, in [0, dp)); as many
// positions as the most documents one rank holds.
inline std::vector<int32_t> lockstep_passes(const std::vector<int32_t>& chunks, const std::vector<int32_t>& rank,
                                            int32_t dp) {
  std::vector<int32_t> held(dp, 0), out;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const int32_t position = held[rank[k]]++;
    if (position == static_cast<int32_t>(out.size())) out.push_back(0);
    out[position] = std::max(out[position], chunks[k]);
  }
  return out;
}

// Lockstep: per DP rank, the pad chunks it runs in all: every position's
// passes summed, less its own documents' chunks.
inline std::vector<int32_t> lockstep_pads(const std::vector<int32_t>& chunks, const std::vector<int32_t>& rank,
                                          int32_t dp) {
  int64_t total = 0;
  for (int32_t n : lockstep_passes(chunks, rank, dp)) total += n;
  std::vector<int64_t> own(dp, 0);
  for (size_t k = 0; k < chunks.size(); ++k) own[rank[k]] += chunks[k];
  std::vector<int32_t> out(dp);
  for (int32_t i = 0; i < dp; ++i) out[i] = static_cast<int32_t>(total - own[i]);
  return out;
}

// Per DP rank: the summed time of the chunked documents it runs.
inline std::vector<double> chunked_load(const std::vector<double>& chunked_us, const std::vector<int32_t>& rank,
                                        int32_t dp) {
  std::vector<double> out(dp, 0.0);
  for (size_t k = 0; k < chunked_us.size(); ++k) out[rank[k]] += chunked_us[k];
  return out;
}

// Lockstep at DP > 1: per DP rank, what its pads add (lockstep_pads'
// counts): at each position k, its k-th document (length T, c chunks, a last
// chunk of l tokens) padded with n_k - c pad chunks from its padded length
// ceil(T / cp) cp (train/chunked.py: the last chunk is padded to a multiple of
// the group), or an all-pad document of n_k from 0; each run priced by
// CostModel::pad_chunks_us. A document with pads after it has its last chunk
// recomputed too (no longer its position's last pass, it is checkpointed),
// which its own price (chunk_cost, the last chunk kept) leaves out:
// chunk_pass_us(T - l, l, cp, true) - chunk_pass_us(T - l, l, cp, false) more.
// Zeros at DP 1 (nothing pads). O(documents + dp): the all-pad runs are
// summed once per position.
inline std::vector<double> lockstep_pad_us(const ChunkedDocs& docs, const std::vector<int32_t>& rank, int32_t dp,
                                           int32_t cp, const CostModel& cost) {
  std::vector<double> out(dp, 0.0);
  if (dp <= 1 || docs.empty()) return out;
  const std::vector<int32_t> passes = lockstep_passes(docs.chunks, rank, dp);
  std::vector<std::vector<int32_t>> held(dp);
  for (size_t k = 0; k < docs.size(); ++k) held[rank[k]].push_back(static_cast<int32_t>(k));
  // suffix[p]: an all-pad document at every position from p on.
  std::vector<double> suffix(passes.size() + 1, 0.0);
  for (size_t p = passes.size(); p-- > 0;) suffix[p] = cost.pad_chunks_us(0, passes[p], cp) + suffix[p + 1];
  for (int32_t i = 0; i < dp; ++i) {
    double sum = 0.0;
    for (size_t p = 0; p < held[i].size(); ++p) {
      const int32_t k = held[i][p];
      const int64_t pads = passes[p] - docs.chunks[k];
      if (pads == 0) continue;
      const int64_t start = (docs.lengths[k] + cp - 1) / cp * cp;
      const int64_t t = docs.last_chunk[k], a = docs.lengths[k] - t;
      sum += cost.pad_chunks_us(start, pads, cp) +
             (cost.chunk_pass_us(a, t, cp, true) - cost.chunk_pass_us(a, t, cp, false));
    }
    out[i] = sum + suffix[held[i].size()];
  }
  return out;
}

// Per DP rank: the work it runs after its micro-batches (timeline.hpp's
// after_us), its chunked documents' times and, on a lockstep timeline at
// DP > 1, its pad chunks' price (pad_us: lockstep_pad_us, one per rank).
inline std::vector<double> chunked_after(const std::vector<double>& chunked_us, const std::vector<int32_t>& rank,
                                         int32_t dp, Timeline timeline, const std::vector<double>& pad_us) {
  std::vector<double> out = chunked_load(chunked_us, rank, dp);
  if (timeline != Timeline::kLockstep || dp <= 1 || chunked_us.empty()) return out;
  for (int32_t i = 0; i < dp; ++i) out[i] += pad_us[i];
  return out;
}

// A rank's chunked time in the unit split_over_dp balances (per-layer forward
// FLOPs of one sequence): the FLOPs whose compute takes that long sharded
// over the CP group, layers x a x FLOPs / cp (the line's rate: a unit for
// balancing, into which a time held up to the host floor converts as well).
inline std::vector<double> chunked_flops(const std::vector<double>& load_us, const CostModel& cost, int32_t cp) {
  std::vector<double> out(load_us.size(), 0.0);
  const double per_flop = cost.shape.layers * cost.a_us_per_flop / cp;
  if (per_flop > 0.0)
    for (size_t i = 0; i < load_us.size(); ++i) out[i] = load_us[i] / per_flop;
  return out;
}

}  // namespace skrull
