// Plain data in and out of the scheduler core: options, per-micro-batch
// results, GDS's Schedule and the one plan type, Plan. No behaviour lives here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace skrull {

// Placement value of a sequence that is sharded over the whole CP group.
constexpr int32_t kDistributed = -1;
// DP rank value of a sequence removed by the "drop" over-length mode.
constexpr int32_t kDropped = -1;

// Accepted input ranges. Every token sum of an accepted input fits in int64
// with a wide margin (2^24 sequences x 2^36 tokens = 2^60), and FLOP counts
// stay finite doubles.
constexpr int64_t kMaxLength = int64_t{1} << 36;      // tokens per sequence
constexpr int64_t kMaxBucketSize = int64_t{1} << 36;  // tokens per CP rank
constexpr int64_t kMaxSequences = int64_t{1} << 24;   // per global batch
constexpr int32_t kMaxRanks = 1 << 16;                // DP or CP group size
// Sequences x CP ranks of one global batch: a plan holds per-rank figures
// for up to one micro-batch per sequence (16 bytes per rank each), so this
// bounds its size (4 GiB) and the per-rank work of one count-search split.
constexpr int64_t kMaxSequenceRanks = int64_t{1} << 28;

enum class Status : int32_t {
  kOk = 0,
  kUnschedulable = 1,  // DACP: the micro-batch does not fit in memory
};

// DACP placement rule for a sequence (docs/design/algorithms.md, Algorithm 1 vs 4).
enum class Placement : int32_t {
  kLeastLoad = 0,  // Skrull: least-loaded rank, then the rank with most room
  kWorstFit = 1,   // paper's "round-robin": rank with most room only
};

// Which local sequence a roll-back turns into a distributed one.
enum class Rollback : int32_t {
  kLongest = 0,   // frees the most memory in one step
  kShortest = 1,  // as published
};

// How GDS picks the number of micro-batches of a DP rank.
enum class MicroBatchCount : int32_t {
  kSmallestFeasible = 0,  // as published
  kPredictedTime = 1,     // best predicted time among a few feasible counts
};

// Which DACP placements a micro-batch may use (dacp_sweep.hpp).
enum class DacpSearch : int32_t {
  kHeuristic = 0,   // Algorithm 1 (or 4) only, as published
  kShardSweep = 1,  // also the sweep over sharding the k longest; fastest predicted wins
};

// What to do with a sequence no plan can hold (longer than the largest
// length a CP group can shard within BucketSize per rank).
enum class Overlength : int32_t {
  kError = 0,
  kTruncate = 1,
  kDrop = 2,
};

// The timeline the trainer executes a step on (timeline.hpp).
enum class Timeline : int32_t {
  kLockstep = 0,     // FSDP over the DP ranks: every rank runs slot j together; step = sum of slot maxima
  kFreeRunning = 1,  // no collective across DP ranks until the gradient reduction: step = slowest rank's sum
};

// The defaults below serve C++ callers (tests, the fuzzer). The knobs'
// defaults live once, in Python (skrull_ext/scheduler/config.py,
// SchedulingOptions): SchedulerConfig.core_options sets every field declared
// there, so these never decide a Python run; only sweep_margin and
// pool_widen are the core's own.
struct Options {
  int32_t dp = 1;               // DP ranks
  int32_t cp = 1;               // CP ranks per group (N)
  int64_t bucket_size = 26624;  // BucketSize C: tokens one CP rank can hold
  Placement placement = Placement::kLeastLoad;
  Rollback rollback = Rollback::kLongest;
  MicroBatchCount micro_batch_count = MicroBatchCount::kSmallestFeasible;
  DacpSearch dacp_search = DacpSearch::kHeuristic;
  int32_t max_extra_micro_batches = 1;  // kPredictedTime search window
  bool refine = false;                  // time-driven local search after DACP (refine.hpp)
  // The shard sweep runs only when Algorithm 1's (refined) placement is
  // more than this fraction above the micro-batch's lower bound, or failed.
  double sweep_margin = 0.01;
  Overlength overlength = Overlength::kError;
  // What the plan is timed on (makespan_us, the micro-batch count search).
  Timeline timeline = Timeline::kLockstep;
  // GDS over micro-batch slots (slots.hpp) instead of the paper's per-DP-rank
  // split: for a lockstep timeline, where each slot should be balanced over
  // the DP ranks.
  bool slot_gds = false;
  // schedule_pool only (pool.hpp); schedule() ignores them.
  // A sequence is sharded over more than one CP group when, sharded over its
  // own group alone, it would take more than pool_widen x the ideal time of
  // a group (the global batch's work spread over every rank).
  double pool_widen = 1.0;
};

// DACP result for one micro-batch on one CP group.
struct DacpResult {
  Status status = Status::kOk;
  std::vector<int32_t> cp_rank;       // per input sequence: rank or kDistributed
  std::vector<int64_t> rank_tokens;   // tokens held by each CP rank
  std::vector<double> rank_flops;     // per-layer forward FLOPs of each rank
  double comm_bytes = 0.0;            // K/V bytes exchanged per layer
  double time_us = 0.0;               // predicted fwd+bwd time, all layers
  int32_t rollbacks = 0;
  int32_t moves = 0;                  // refinement moves (refine.hpp)
};

struct MicroBatch {
  int32_t dp_rank = 0;
  int32_t index = 0;             // position in its DP rank's sequence
  std::vector<int32_t> seqs;     // global indices, in buffer order
  DacpResult dacp;               // dacp.cp_rank[i] places seqs[i]
};

// GDS + DACP's answer in the paper's form: per DP rank, its micro-batches
// back to back. What a job runs is a Plan (below); to_plan() (plan.hpp)
// turns a Schedule into its one-group case.
struct Schedule {
  // Per sequence of the global batch, in the caller's order.
  std::vector<int64_t> lengths;      // effective (after truncation)
  std::vector<int32_t> dp_rank;      // or kDropped
  std::vector<int32_t> micro_batch;  // index within the DP rank, -1 if dropped
  std::vector<int32_t> cp_rank;      // CP rank or kDistributed (-1 if dropped)
  // Micro-batches grouped by DP rank: rank i owns
  // micro_batches[dp_offsets[i] .. dp_offsets[i+1]).
  std::vector<MicroBatch> micro_batches;
  std::vector<int32_t> dp_offsets;
  std::vector<double> dp_time_us;  // predicted time of each DP rank (its micro-batches back to back)
  double makespan_us = 0.0;        // predicted step time on opt.timeline (timeline.hpp)
  std::vector<int32_t> dropped;    // indices removed by Overlength::kDrop
  std::vector<int32_t> truncated;  // indices shortened by Overlength::kTruncate
  // Chunked documents (overlength "chunk", chunked.hpp), outside `lengths`:
  // each one's predicted time on a CP group and the DP rank that trains it
  // after its micro-batches (included in dp_time_us and makespan_us), and
  // its chunk passes (what lockstep pads to, chunked.hpp), its length and its
  // last chunk's tokens;
  // per DP rank, the price of the pad chunks it would run on a lockstep
  // timeline (chunked.hpp lockstep_pad_us; in dp_time_us and makespan_us on
  // one).
  std::vector<double> chunked_us;
  std::vector<int32_t> chunked_dp_rank;
  std::vector<int32_t> chunked_chunks;
  std::vector<int64_t> chunked_lengths;
  std::vector<int64_t> chunked_last_chunk;
  std::vector<double> chunked_pad_us;
  int32_t rollbacks = 0;
  int32_t moves = 0;
  double elapsed_us = 0.0;         // wall time of the scheduler call
};

// One micro-batch of a plan: a slot on a block of CP groups (one group
// under skrull; several for a skrull-pool sequence sharded wide).
// Every rank of the block runs it at its slot; each sequence's rank set is
// the contiguous global ranks [first_rank, first_rank + num_ranks), inside
// the block (global rank = dp_rank * cp + cp_rank). num_ranks 1 = local.
struct PlanMicroBatch {
  int32_t slot = 0;
  int32_t first_group = 0;             // CP groups (DP ranks) [first_group, first_group + groups)
  int32_t groups = 1;
  std::vector<int32_t> seqs;           // global indices, in buffer order
  std::vector<int32_t> first_rank;     // per sequence
  std::vector<int32_t> num_ranks;      // per sequence
  std::vector<int64_t> rank_tokens;    // per rank of the block, block order
  std::vector<double> rank_flops;      // per rank of the block: per-layer forward FLOPs (a sequence's split over its set)
  double comm_bytes = 0.0;             // K/V bytes gathered per layer, all its sharded sequences
  double start_us = 0.0;               // predicted start (all its groups free)
  double time_us = 0.0;                // predicted fwd+bwd time, all layers
  int32_t rollbacks = 0;
  int32_t moves = 0;
};

// The one plan type: what every rank runs at each slot of a step. Built by
// schedule_pool (pool.hpp) and, from skrull's Schedule, by to_plan (plan.hpp).
struct Plan {
  // Per sequence of the global batch, in the caller's order.
  std::vector<int64_t> lengths;        // effective (after truncation)
  std::vector<int32_t> micro_batch;    // index into micro_batches, -1 if dropped
  std::vector<int32_t> first_rank;     // its rank set (0, 0 if dropped)
  std::vector<int32_t> num_ranks;
  std::vector<PlanMicroBatch> micro_batches;  // by slot, then first group
  int32_t slots = 0;
  std::vector<double> group_time_us;   // predicted finish of each CP group, running free
  double makespan_us = 0.0;            // predicted step time on opt.timeline (timeline.hpp)
  std::vector<int32_t> dropped;        // removed by Overlength::kDrop
  std::vector<int32_t> truncated;      // shortened by Overlength::kTruncate
  // Chunked documents (as Schedule's): each one's time and the CP group that
  // runs it after its micro-batches (in group_time_us and makespan_us), and
  // its chunk passes; per group, its lockstep pad chunks' price (empty: none).
  std::vector<double> chunked_us;
  std::vector<int32_t> chunked_group;
  std::vector<int32_t> chunked_chunks;
  std::vector<double> chunked_pad_us;
  int32_t widened = 0;                 // sequences sharded over more than one CP group
  int32_t narrowed = 0;                // sequences sharded over 2 <= k < cp ranks of one group
  bool skrull_plan = false;            // skrull's plan, kept because it predicted no slower
  int32_t rollbacks = 0;
  int32_t moves = 0;
  double elapsed_us = 0.0;
};

}  // namespace skrull
