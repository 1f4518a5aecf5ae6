// Test-only oracle for skrull-pool's plans (pool.hpp), used by the fuzzer:
// whether schedule_pool must accept an input (the documented ranges,
// restated with the world's over-length limit), and whether a Plan it
// returns is sound, with plain arithmetic: every sequence kept exactly once
// on a rank set of the allowed shapes inside its micro-batch's block, each
// rank's tokens recomputed and within bucket_size, and the step and every
// start and group finish replayed on the plan's timeline (timeline.hpp's
// rule, restated). The twin of plan_check.hpp for the pool's Plan.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plan_check.hpp"
#include "skrull/pool.hpp"

namespace skrull::check {

// Longest sequence `ranks` ranks of `bucket` tokens hold (max_sequence_length's rule), in 128 bits
// and then saturated: a world may have 2^32 ranks.
inline int64_t world_limit(int64_t bucket, int64_t ranks) {
  if (ranks <= 1) return bucket;
  const __int128 sharded = static_cast<__int128>(2) * ranks * (bucket / 2);
  const __int128 most = std::max<__int128>(bucket, sharded);
  return most > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(most);
}

// Empty when schedule_pool() must accept the input, else why it must refuse it. As schedule's,
// but the batch is held by the dp x cp world: sequences x world at most 2^28 and over-length past
// what the world holds.
inline std::string pool_rejection(const std::vector<int64_t>& in, const CostModel& c, const Options& o) {
  const std::string base = schedule_rejection({}, c, o);  // options and cost; no lengths, no group's limit
  if (!base.empty()) return base;
  if (in.size() > (size_t{1} << 24)) return "too many sequences";
  const int64_t world = static_cast<int64_t>(o.dp) * o.cp;
  if (static_cast<__int128>(in.size()) * world > (int64_t{1} << 28)) return "sequences x world";
  const int64_t limit = world_limit(o.bucket_size, world);
  for (int64_t s : in) {
    if (s < 1 || s > (int64_t{1} << 36)) return "length range";
    if (s > limit && o.overlength == Overlength::kError) return "over-length";
  }
  return "";
}

inline bool power_of_two(int64_t k) { return k > 0 && (k & (k - 1)) == 0; }

// Empty when p is a sound pool plan of `in` under (c, o).
inline std::string pool_error(const std::vector<int64_t>& in, const CostModel& c, const Options& o, const Plan& p) {
  const size_t n = in.size();
  const int32_t dp = o.dp, cp = o.cp;
  const int64_t limit = world_limit(o.bucket_size, static_cast<int64_t>(dp) * cp);
  if (p.lengths.size() != n || p.micro_batch.size() != n || p.first_rank.size() != n || p.num_ranks.size() != n)
    return "per-sequence arrays have the wrong size";
  if (p.group_time_us.size() != static_cast<size_t>(dp)) return "group_time_us size";
  if (!p.chunked_us.empty() || !p.chunked_group.empty() || !p.chunked_chunks.empty()) return "chunked documents";
  std::vector<char> dropped;
  const std::string cut = cut_error(in, limit, o.overlength, p.dropped, p.truncated, p.lengths, dropped);
  if (!cut.empty()) return cut;
  for (size_t k = 0; k < n; ++k)
    if (dropped[k] && p.micro_batch[k] != -1) return "dropped sequence placed";
  std::vector<int32_t> seen(n, 0);
  int32_t widened = 0, narrowed = 0, rollbacks = 0;
  for (size_t m = 0; m < p.micro_batches.size(); ++m) {
    const PlanMicroBatch& mb = p.micro_batches[m];
    if (m > 0) {  // by slot, then first group
      const PlanMicroBatch& prev = p.micro_batches[m - 1];
      if (prev.slot > mb.slot || (prev.slot == mb.slot && prev.first_group >= mb.first_group))
        return "micro-batches out of (slot, first group) order";
    }
    if (mb.slot < 0 || mb.slot >= p.slots) return "slot out of range";
    if (mb.groups < 1 || mb.first_group < 0 || mb.first_group + static_cast<int64_t>(mb.groups) > dp)
      return "block out of range";
    // A block of several groups: 2^a groups aligned at a multiple of 2^a, or all dp groups.
    if (mb.groups > 1 && !(power_of_two(mb.groups) ? mb.first_group % mb.groups == 0 : mb.first_group == 0 &&
                                                                                            mb.groups == dp))
      return "block not aligned";
    if (mb.seqs.empty()) return "empty micro-batch";
    if (mb.first_rank.size() != mb.seqs.size() || mb.num_ranks.size() != mb.seqs.size())
      return "micro-batch rank sets size";
    const int64_t base = static_cast<int64_t>(mb.first_group) * cp;
    const int64_t width = static_cast<int64_t>(mb.groups) * cp;
    std::vector<int64_t> tokens(width, 0);
    for (size_t q = 0; q < mb.seqs.size(); ++q) {
      const int32_t k = mb.seqs[q];
      if (k < 0 || static_cast<size_t>(k) >= n || dropped[k]) return "sequence index out of range or dropped";
      ++seen[k];
      if (p.micro_batch[k] != static_cast<int32_t>(m) || p.first_rank[k] != mb.first_rank[q] ||
          p.num_ranks[k] != mb.num_ranks[q])
        return "per-sequence arrays disagree with the micro-batch";
      const int64_t first = mb.first_rank[q] - base, ranks = mb.num_ranks[q];
      if (ranks < 1 || first < 0 || first + ranks > width) return "rank set outside its block";
      // One rank; an aligned power-of-two block of 2 <= k < cp ranks of a one-group micro-batch;
      // the whole group; or the whole block of several groups (its micro-batch alone).
      const bool whole_block = ranks == width && first == 0;
      const bool sub = mb.groups == 1 && ranks >= 2 && ranks < cp && power_of_two(ranks) && first % ranks == 0;
      if (!(ranks == 1 || whole_block || sub)) return "rank set of a shape the pool does not make";
      if (mb.groups > 1 && (mb.seqs.size() != 1 || !whole_block)) return "a wide micro-batch holds more";
      widened += mb.groups > 1;
      narrowed += sub;
      const int64_t s = p.lengths[k];
      for (int64_t r = first; r < first + ranks; ++r) tokens[r] += ranks == 1 ? s : shard_of(s, static_cast<int32_t>(ranks));
    }
    if (mb.rank_tokens != tokens) return "rank_tokens disagree with the rank sets";
    for (int64_t t : tokens)
      if (t > o.bucket_size) return "a rank holds more than bucket_size";
    if (!std::isfinite(mb.time_us) || mb.time_us < 0 || !std::isfinite(mb.comm_bytes) || mb.comm_bytes < 0)
      return "micro-batch time or bytes not finite";
    rollbacks += mb.rollbacks;
  }
  for (size_t k = 0; k < n; ++k)
    if (seen[k] != (dropped[k] ? 0 : 1)) return "sequence " + std::to_string(k) + " placed " + std::to_string(seen[k]) + " times";
  if (widened != p.widened) return "widened count";
  if (narrowed != p.narrowed) return "narrowed count";
  if (rollbacks != p.rollbacks) return "roll-back total";
  // The timeline, replayed in the plan's order: each micro-batch starts when all its groups are
  // free (free-running) or when its slot starts (lockstep: each slot as long as its slowest
  // micro-batch, or a pad pass where a group idles in it).
  std::vector<double> clock(dp, 0.0);
  std::map<int32_t, double> slowest;
  std::map<int32_t, int64_t> busy;
  for (const PlanMicroBatch& mb : p.micro_batches) {
    double start = 0.0;
    for (int32_t g = mb.first_group; g < mb.first_group + mb.groups; ++g) start = std::max(start, clock[g]);
    for (int32_t g = mb.first_group; g < mb.first_group + mb.groups; ++g) clock[g] = start + mb.time_us;
    if (o.timeline == Timeline::kFreeRunning && mb.start_us != start) return "start is not when its groups are free";
    slowest[mb.slot] = std::max(slowest[mb.slot], mb.time_us);
    busy[mb.slot] += mb.groups;
  }
  double step = 0.0;
  std::map<int32_t, double> slot_start;
  for (const auto& [slot, t] : slowest) {
    slot_start[slot] = step;
    step += busy[slot] < dp ? std::max(t, c.pad_pass_us()) : t;
  }
  if (o.timeline == Timeline::kLockstep)
    for (const PlanMicroBatch& mb : p.micro_batches)
      if (mb.start_us != slot_start[mb.slot]) return "lockstep start is not its slot's";
  if (o.timeline == Timeline::kFreeRunning && dp > 1 && !p.micro_batches.empty()) {  // an idle group's pad pass
    std::vector<char> used(dp, 0);
    for (const PlanMicroBatch& mb : p.micro_batches)
      for (int32_t g = mb.first_group; g < mb.first_group + mb.groups; ++g) used[g] = 1;
    for (int32_t g = 0; g < dp; ++g)
      if (!used[g]) clock[g] += c.pad_pass_us();
  }
  if (o.timeline == Timeline::kFreeRunning) step = *std::max_element(clock.begin(), clock.end());
  if (!p.micro_batches.empty()) step += c.step_fixed_us;
  if (clock != p.group_time_us) return "group finish times";
  if (!std::isfinite(p.makespan_us)) return "step time not finite";
  if (step != p.makespan_us) return "makespan is not the step time on the plan's timeline";
  if (!std::isfinite(p.elapsed_us) || p.elapsed_us < 0) return "elapsed_us";
  return "";
}

}  // namespace skrull::check
