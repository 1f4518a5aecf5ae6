// Test-only oracle shared by test_hardening.cpp and the fuzzer: checks a
// Schedule / DacpResult with plain arithmetic, independently of the core
// (the C++ twin of skrull_ext/plan.py Plan.validate), and says whether the
// core must accept an input at all (the documented ranges, restated).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "skrull/scheduler.hpp"

namespace skrull::check {

inline int64_t limit_of(int64_t bucket, int32_t cp) { return cp <= 1 ? bucket : std::max(bucket, 2 * cp * (bucket / 2)); }

inline int64_t shard_of(int64_t s, int32_t cp) { return cp <= 1 ? s : 2 * ((s + 2 * cp - 1) / (2 * cp)); }

// Empty when the cost model is within the documented ranges, else why not.
inline std::string cost_rejection(const CostModel& c) {
  auto ok = [](double v, double hi) { return std::isfinite(v) && v >= 0.0 && v <= hi; };
  if (c.shape.layers < 1 || c.shape.layers > (1 << 16)) return "layers";
  if (c.shape.hidden < 1 || c.shape.hidden > (1 << 20)) return "hidden";
  if (c.shape.kv_width < 1 || c.shape.kv_width > (1 << 20)) return "kv_width";
  if (c.shape.bytes_per_elem < 1 || c.shape.bytes_per_elem > 16) return "bytes_per_elem";
  if (!ok(c.a_us_per_flop, 1.0)) return "a_us_per_flop";
  if (!ok(c.b_us, 1e9)) return "b_us";
  if (c.comm.bytes.empty() || c.comm.bytes.size() != c.comm.us.size()) return "comm table size";
  for (size_t i = 0; i < c.comm.bytes.size(); ++i) {
    if (!std::isfinite(c.comm.bytes[i]) || c.comm.bytes[i] < 0 || !ok(c.comm.us[i], 1e9)) return "comm point";
    if (i > 0 && !(c.comm.bytes[i] - c.comm.bytes[i - 1] >= 1.0)) return "comm spacing";
  }
  if (!std::isfinite(c.comm.threshold_bytes) || c.comm.threshold_bytes < 0) return "threshold";
  if (!ok(c.comm.floor_us, 1e9)) return "floor";
  if (!ok(c.comm.collectives_per_layer, 1e3)) return "collectives_per_layer";
  if (!(std::isfinite(c.comm.plan_margin) && c.comm.plan_margin >= 1.0 && c.comm.plan_margin <= 10.0))
    return "plan_margin";
  if (!(c.comm.collectives_per_layer * c.comm.plan_margin <= 1e3)) return "collectives_per_layer x plan_margin";
  if (!(std::isfinite(c.comm.cross_group_factor) && c.comm.cross_group_factor >= 1.0 &&
        c.comm.cross_group_factor <= 1e3))
    return "cross_group_factor";
  if (c.shape.tp < 1 || c.shape.tp > (1 << 10)) return "tp";
  if (!ok(c.micro_batch_fixed_us, 1e9)) return "micro_batch_fixed_us";
  if (!ok(c.step_fixed_us, 1e9)) return "step_fixed_us";
  if (!ok(c.token_us, 1e3)) return "token_us";
  if (!(std::isfinite(c.attention_weight) && c.attention_weight > 0.0 && c.attention_weight <= 4.0))
    return "attention_weight";
  if (!ok(c.host_floor_us, 1e9)) return "host_floor_us";
  return "";
}

// Empty when schedule() must accept the input, else why it must refuse it.
inline std::string schedule_rejection(const std::vector<int64_t>& in, const CostModel& c, const Options& o) {
  if (o.dp < 1 || o.dp > (1 << 16)) return "dp";
  if (o.cp < 1 || o.cp > (1 << 16)) return "cp";
  if (o.bucket_size < 1 || o.bucket_size > (int64_t{1} << 36)) return "bucket_size";
  if (o.max_extra_micro_batches < 0 || o.max_extra_micro_batches > 1024) return "max_extra_micro_batches";
  auto in_enum = [](auto e, int32_t hi) { return static_cast<int32_t>(e) >= 0 && static_cast<int32_t>(e) <= hi; };
  if (!in_enum(o.placement, 1) || !in_enum(o.rollback, 1) || !in_enum(o.micro_batch_count, 1) ||
      !in_enum(o.overlength, 2) || !in_enum(o.dacp_search, 1))
    return "enum";
  if (!(o.sweep_margin >= 0.0 && o.sweep_margin <= 100.0)) return "sweep_margin";
  if (!in_enum(o.timeline, 1)) return "timeline";
  if (!(o.pool_widen >= 0.0 && o.pool_widen <= 1e6)) return "pool_widen";  // the pool's, but schedule() checks it too
  const std::string cost = cost_rejection(c);
  if (!cost.empty()) return cost;
  if (in.size() > (size_t{1} << 24)) return "too many sequences";
  if (static_cast<int64_t>(in.size()) * o.cp > (int64_t{1} << 28)) return "sequences x cp";
  const int64_t limit = limit_of(o.bucket_size, o.cp);
  for (int64_t s : in) {
    if (s < 1 || s > (int64_t{1} << 36)) return "length range";
    if (s > limit && o.overlength == Overlength::kError) return "over-length";
  }
  return "";
}

// Empty when schedule() must accept these chunked documents (times and chunk
// passes), else why it must refuse them.
inline std::string chunked_rejection(const std::vector<double>& us, const std::vector<int32_t>& chunks) {
  if (us.size() > (size_t{1} << 24)) return "chunked documents";
  if (chunks.size() != us.size()) return "chunk counts";
  int64_t passes = 0;
  for (size_t k = 0; k < us.size(); ++k) {
    if (!(std::isfinite(us[k]) && us[k] >= 0.0 && us[k] <= 1e60)) return "chunked time";
    if (chunks[k] < 1) return "chunk count";
    passes += chunks[k];
  }
  if (passes > (int64_t{1} << 30)) return "chunk passes";
  return "";
}

// Tokens each CP rank holds under a placement.
inline std::vector<int64_t> rank_tokens(const std::vector<int64_t>& lengths, const std::vector<int32_t>& cp_rank,
                                        int32_t cp) {
  std::vector<int64_t> t(cp, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (cp_rank[i] == kDistributed) {
      for (auto& x : t) x += shard_of(lengths[i], cp);
    } else {
      t[cp_rank[i]] += lengths[i];
    }
  }
  return t;
}

// Empty when r is a sound DACP answer for (lengths, cp, bucket).
inline std::string dacp_error(const std::vector<int64_t>& lengths, int32_t cp, int64_t bucket, const DacpResult& r) {
  const size_t n = lengths.size();
  if (r.cp_rank.size() != n) return "cp_rank size";
  for (int32_t p : r.cp_rank)
    if (p != kDistributed && (p < 0 || p >= cp)) return "placement out of range";
  if (r.rank_tokens != rank_tokens(lengths, r.cp_rank, cp)) return "rank_tokens disagree with the placement";
  if (r.rank_flops.size() != static_cast<size_t>(cp)) return "rank_flops size";
  if (!std::isfinite(r.time_us) || r.time_us < 0 || !std::isfinite(r.comm_bytes) || r.comm_bytes < 0)
    return "time or bytes not finite";
  if (r.rollbacks < 0 || static_cast<size_t>(r.rollbacks) > n) return "more roll-backs than sequences";
  if (r.status == Status::kOk) {
    for (int64_t t : r.rank_tokens)
      if (t > bucket) return "a rank holds more than bucket_size";
    if (r.moves < 0 || static_cast<size_t>(r.moves) > n) return "more refinement moves than sequences";
  } else if (n == 0 || (n == 1 && lengths[0] <= limit_of(bucket, cp))) {
    return "unschedulable though trivially feasible";
  }
  return "";
}

// Empty when `dropped` and `truncated` (index lists) are exactly the sequences of `in` longer than
// `limit` that o.overlength drops or truncates, and `lengths` is `in` with the truncated ones cut to
// `limit` (a dropped one keeps its length). `is_dropped` gets each sequence's flag.
inline std::string cut_error(const std::vector<int64_t>& in, int64_t limit, Overlength overlength,
                             const std::vector<int32_t>& dropped, const std::vector<int32_t>& truncated,
                             const std::vector<int64_t>& lengths, std::vector<char>& is_dropped) {
  const size_t n = in.size();
  std::vector<char> is_truncated(n, 0);
  is_dropped.assign(n, 0);
  for (int32_t k : dropped) {
    if (k < 0 || static_cast<size_t>(k) >= n || is_dropped[k]) return "bad dropped list";
    is_dropped[k] = 1;
  }
  for (int32_t k : truncated) {
    if (k < 0 || static_cast<size_t>(k) >= n || is_truncated[k]) return "bad truncated list";
    is_truncated[k] = 1;
  }
  for (size_t k = 0; k < n; ++k) {
    const bool over = in[k] > limit;
    if (is_dropped[k] != (over && overlength == Overlength::kDrop)) return "dropped set wrong";
    if (is_truncated[k] != (over && overlength == Overlength::kTruncate)) return "truncated set wrong";
    if (lengths[k] != (is_truncated[k] ? limit : in[k])) return "length changed";
  }
  return "";
}

// Empty when s is a valid plan of `in` under (c, o): every sequence in
// exactly one micro-batch unless dropped, lengths changed only by
// truncation, placements in range, per-rank tokens recomputed equal and
// within bucket_size, times finite and adding up: a DP rank's time is its
// micro-batches', then its chunked documents' and (lockstep, DP > 1) its pad
// chunks' (each run from its document's padded length, or 0 for an all-pad
// one, at c.pad_chunks_us, and a padded document's last chunk's recompute;
// s.chunked_pad_us within 1e-12 of it) and
// (free-running, DP > 1) a pad pass where it has no micro-batch; the step is
// on o.timeline, plus c.step_fixed_us once when it runs anything.
inline std::string schedule_error(const std::vector<int64_t>& in, const CostModel& c, const Options& o,
                                  const Schedule& s) {
  const size_t k_total = in.size();
  const int64_t limit = limit_of(o.bucket_size, o.cp);
  if (s.lengths.size() != k_total || s.dp_rank.size() != k_total || s.micro_batch.size() != k_total ||
      s.cp_rank.size() != k_total)
    return "per-sequence arrays have the wrong size";
  if (s.dp_offsets.size() != static_cast<size_t>(o.dp) + 1 || s.dp_offsets.front() != 0 ||
      s.dp_offsets.back() != static_cast<int32_t>(s.micro_batches.size()) ||
      s.dp_time_us.size() != static_cast<size_t>(o.dp))
    return "dp_offsets or dp_time_us malformed";
  std::vector<char> dropped;
  const std::string cut = cut_error(in, limit, o.overlength, s.dropped, s.truncated, s.lengths, dropped);
  if (!cut.empty()) return cut;
  for (size_t k = 0; k < k_total; ++k) {
    if (dropped[k]) {
      if (s.dp_rank[k] != kDropped || s.micro_batch[k] != -1) return "dropped sequence placed";
      continue;
    }
    if (s.dp_rank[k] < 0 || s.dp_rank[k] >= o.dp) return "dp_rank out of range";
    if (s.cp_rank[k] != kDistributed && (s.cp_rank[k] < 0 || s.cp_rank[k] >= o.cp)) return "cp_rank out of range";
  }
  std::vector<int32_t> seen(k_total, 0);
  int64_t rollbacks = 0;
  // Chunked documents (chunked.hpp): each on a DP rank in range, run after its micro-batches.
  const size_t docs = s.chunked_us.size();
  if (s.chunked_dp_rank.size() != docs || s.chunked_chunks.size() != docs || s.chunked_lengths.size() != docs ||
      s.chunked_last_chunk.size() != docs)
    return "chunked documents, their ranks, chunk counts, lengths and last chunks differ in number";
  if (s.chunked_pad_us.size() != static_cast<size_t>(o.dp)) return "chunked_pad_us is not one per DP rank";
  std::vector<double> after(o.dp, 0.0);
  std::vector<std::vector<size_t>> held(o.dp);  // each rank's documents, in order
  for (size_t k = 0; k < docs; ++k) {
    if (s.chunked_dp_rank[k] < 0 || s.chunked_dp_rank[k] >= o.dp) return "chunked document's DP rank out of range";
    if (s.chunked_chunks[k] < 1) return "chunked document with fewer than one chunk";
    after[s.chunked_dp_rank[k]] += s.chunked_us[k];
    held[s.chunked_dp_rank[k]].push_back(k);
  }
  if (o.dp > 1 && docs > 0) {
    // Every rank runs, at its k-th document, as many passes as the most any rank's k-th takes (none
    // held: an all-pad document from 0); what it runs past its own chunks are pad chunks, from its
    // document's length rounded up to the CP group.
    std::vector<int64_t> most;
    for (size_t k = 0;; ++k) {
      int64_t m = 0;
      for (const auto& h : held)
        if (k < h.size()) m = std::max<int64_t>(m, s.chunked_chunks[h[k]]);
      if (m == 0) break;
      most.push_back(m);
    }
    for (int32_t d = 0; d < o.dp; ++d) {
      double pads = 0.0;
      for (size_t k = 0; k < most.size(); ++k) {
        const bool own = k < held[d].size();
        const int64_t n = most[k] - (own ? s.chunked_chunks[held[d][k]] : 0);
        if (n < 0) return "negative pad chunks";
        const int64_t start = own ? (s.chunked_lengths[held[d][k]] + o.cp - 1) / o.cp * o.cp : 0;
        pads += c.pad_chunks_us(start, n, o.cp);
        if (own && n > 0) {  // the document's last chunk, no longer its position's last pass, is recomputed
          const int64_t t = s.chunked_last_chunk[held[d][k]], a = s.chunked_lengths[held[d][k]] - t;
          pads += c.chunk_pass_us(a, t, o.cp, true) - c.chunk_pass_us(a, t, o.cp, false);
        }
      }
      if (!(std::abs(pads - s.chunked_pad_us[d]) <= 1e-12 * std::max(1.0, pads))) return "pad chunks' price";
      if (o.timeline == Timeline::kLockstep) after[d] += s.chunked_pad_us[d];
    }
  }
  bool runs = false;  // free-running at DP > 1: a rank with no micro-batch runs a pad pass
  for (int32_t d = 0; d < o.dp; ++d) runs = runs || s.dp_offsets[d] < s.dp_offsets[d + 1] || after[d] > 0.0;
  if (o.timeline == Timeline::kFreeRunning && o.dp > 1 && runs)
    for (int32_t d = 0; d < o.dp; ++d)
      if (s.dp_offsets[d] == s.dp_offsets[d + 1]) after[d] += c.pad_pass_us();
  bool any_after = false;
  double most_after = 0.0, makespan = 0.0;
  for (double a : after) {
    any_after = any_after || a > 0.0;
    most_after = std::max(most_after, a);
  }
  for (int32_t d = 0; d < o.dp; ++d) {
    if (s.dp_offsets[d] > s.dp_offsets[d + 1]) return "dp_offsets decrease";
    double total = 0.0;
    for (int32_t j = s.dp_offsets[d]; j < s.dp_offsets[d + 1]; ++j) {
      const MicroBatch& mb = s.micro_batches[j];
      if (mb.dp_rank != d || mb.index != j - s.dp_offsets[d]) return "micro-batch mislabelled";
      if (mb.seqs.empty()) return "empty micro-batch";
      if (mb.dacp.status != Status::kOk) return "micro-batch not OK";
      if (mb.dacp.cp_rank.size() != mb.seqs.size()) return "micro-batch placement size";
      std::vector<int64_t> lens;
      for (size_t i = 0; i < mb.seqs.size(); ++i) {
        const int32_t k = mb.seqs[i];
        if (k < 0 || static_cast<size_t>(k) >= k_total) return "sequence index out of range";
        ++seen[k];
        if (s.dp_rank[k] != d || s.micro_batch[k] != mb.index || s.cp_rank[k] != mb.dacp.cp_rank[i])
          return "per-sequence arrays disagree with the micro-batch";
        lens.push_back(s.lengths[k]);
      }
      const std::string e = dacp_error(lens, o.cp, o.bucket_size, mb.dacp);
      if (!e.empty()) return "micro-batch: " + e;
      total += mb.dacp.time_us;
      rollbacks += mb.dacp.rollbacks;
    }
    total += after[d];
    if (!std::isfinite(s.dp_time_us[d])) return "DP rank time not finite";
    if (total != s.dp_time_us[d])
      return "DP rank time is not the sum of its micro-batches, chunked documents and pad chunks";
    makespan = std::max(makespan, total);
  }
  for (size_t k = 0; k < k_total; ++k)
    if (seen[k] != (dropped[k] ? 0 : 1)) return "sequence " + std::to_string(k) + " placed " + std::to_string(seen[k]) + " times";
  if (o.timeline == Timeline::kLockstep) {
    // Slot j lasts as long as its slowest micro-batch, a rank without one running a pad pass; then
    // the rank with the most work after its micro-batches.
    makespan = 0.0;
    for (int32_t j = 0;; ++j) {
      double slot = 0.0;
      bool any = false;
      for (int32_t d = 0; d < o.dp; ++d) {
        const bool has = s.dp_offsets[d] + j < s.dp_offsets[d + 1];
        any = any || has;
        slot = std::max(slot, has ? s.micro_batches[s.dp_offsets[d] + j].dacp.time_us : c.pad_pass_us());
      }
      if (!any) break;
      makespan += slot;
    }
    if (any_after) makespan += most_after;
  }
  if (!s.micro_batches.empty() || any_after) makespan += c.step_fixed_us;
  if (!std::isfinite(s.makespan_us)) return "step time not finite";
  if (makespan != s.makespan_us) return "makespan is not the step time on the plan's timeline";
  if (rollbacks != s.rollbacks) return "roll-back total";
  if (!std::isfinite(s.elapsed_us) || s.elapsed_us < 0) return "elapsed_us";
  return "";
}

}  // namespace skrull::check
