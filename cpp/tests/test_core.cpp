// C++ unit tests of the core, without Python: hand-computed DACP and GDS
// cases, errors, determinism. Run by ctest (see .ci/run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "toy.hpp"
#include "skrull/hedge.hpp"
#include "skrull/lookahead.hpp"
#include "skrull/plan.hpp"
#include "skrull/pool.hpp"
#include "skrull/scheduler.hpp"
#include "skrull/step_estimate.hpp"

using namespace skrull;

using skrull_test::toy;  // flops(s) = 24 s + 4 s^2, T_comp(F) = F, no communication cost (toy.hpp)

static void test_shards() {
  CHECK(shard_tokens(7, 2) == 4);
  CHECK(shard_tokens(9, 2) == 6);
  CHECK(shard_tokens(9, 1) == 9);
  CHECK(max_sequence_length(10, 4) == 40);
  CHECK(max_sequence_length(1, 4) == 1);
}

// The attention term at attention_weight w: flops(s) = 24 s + w 4 s^2, and the
// plan's time follows it (two documents of 3 and 5 on two ranks at T_comp = F).
static void test_attention_weight() {
  CostModel c = toy();
  CHECK(c.flops(10) == 24.0 * 10 + 4.0 * 100);
  c.attention_weight = 0.5;
  CHECK(c.flops(10) == 24.0 * 10 + 0.5 * 4.0 * 100);
  const DacpResult r = dacp({3, 5}, c, 2, 10, Placement::kLeastLoad, Rollback::kLongest);
  CHECK(r.status == Status::kOk && r.time_us == 24.0 * 5 + 2.0 * 25);
  for (double w : {0.0, -1.0, 4.5}) {
    c.attention_weight = w;
    bool refused = false;
    try { c.validate(); } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("attention_weight must be finite and in (0, 4]") != std::string::npos;
    }
    CHECK(refused);
  }
}

static void test_dacp_cases() {
  const CostModel c = toy();
  DacpResult r = dacp({3, 4, 5}, c, 2, 10, Placement::kLeastLoad, Rollback::kLongest);
  CHECK(r.status == Status::kOk);
  CHECK((r.cp_rank == std::vector<int32_t>{0, 1, 0}));
  CHECK(r.time_us == c.flops(3) + c.flops(5));
  r = dacp({4, 4, 4, 9}, c, 2, 12, Placement::kLeastLoad, Rollback::kLongest);
  CHECK((r.cp_rank == std::vector<int32_t>{0, 1, kDistributed, kDistributed}));
  CHECK(r.rollbacks == 1);
  r = dacp({4, 4, 4, 9}, c, 2, 12, Placement::kLeastLoad, Rollback::kShortest);
  CHECK((r.cp_rank == std::vector<int32_t>{kDistributed, 1, 0, kDistributed}));
  r = dacp({5, 5, 9}, c, 2, 10, Placement::kLeastLoad, Rollback::kLongest);
  CHECK(r.status == Status::kUnschedulable);
}

static void test_schedule_cases() {
  const CostModel c = toy();
  Options o;
  o.dp = 2;
  o.cp = 2;
  o.bucket_size = 10;
  o.rollback = Rollback::kShortest;
  const Schedule s = schedule({1, 2, 3, 4, 5, 6}, c, o);
  CHECK((s.dp_rank == std::vector<int32_t>{0, 1, 0, 1, 1, 0}));
  CHECK((s.cp_rank == std::vector<int32_t>{0, 0, 1, 1, 0, 0}));
  Options o1;
  o1.bucket_size = 5;
  const Schedule m = schedule({1, 2, 3, 4}, c, o1);
  CHECK((m.micro_batch == std::vector<int32_t>{0, 1, 2, 0}));
  // Same inputs, same plan, bit for bit.
  const Schedule again = schedule({1, 2, 3, 4, 5, 6}, c, o);
  CHECK(again.cp_rank == s.cp_rank && again.makespan_us == s.makespan_us);
}

// to_plan: every sequence keeps its DP rank (as the group), micro-batch
// (as the slot) and placement (one rank, or the whole group), and the step
// time is the Schedule's on both timelines.
static void check_to_plan(const Schedule& s, int32_t cp, Timeline timeline) {
  const Plan p = to_plan(s, cp, timeline, 0.5);
  CHECK(p.skrull_plan && p.widened == 0 && p.narrowed == 0 && p.lengths == s.lengths);
  CHECK(p.micro_batches.size() == s.micro_batches.size());
  for (size_t k = 0; k < s.lengths.size(); ++k) {
    const PlanMicroBatch& mb = p.micro_batches[p.micro_batch[k]];
    const bool dist = s.cp_rank[k] == kDistributed;
    CHECK(mb.first_group == s.dp_rank[k] && mb.groups == 1 && mb.slot == s.micro_batch[k]);
    CHECK(p.first_rank[k] == s.dp_rank[k] * cp + (dist ? 0 : s.cp_rank[k]));
    CHECK(p.num_ranks[k] == (dist ? cp : 1));
  }
  for (const MicroBatch& mb : s.micro_batches) {
    const PlanMicroBatch& q = p.micro_batches[p.micro_batch[mb.seqs[0]]];
    CHECK(q.rank_tokens == mb.dacp.rank_tokens && q.rank_flops == mb.dacp.rank_flops && q.time_us == mb.dacp.time_us);
  }
  std::vector<std::vector<double>> rank_us(s.dp_time_us.size());
  for (const MicroBatch& mb : s.micro_batches) rank_us[mb.dp_rank].push_back(mb.dacp.time_us);
  CHECK(p.makespan_us == step_time_us(rank_us, timeline, 0.5));
  CHECK(p.group_time_us == s.dp_time_us);
}

static void test_to_plan() {
  const CostModel c = toy();
  Options o;
  o.dp = 2;
  o.cp = 2;
  o.bucket_size = 10;
  const Schedule s = schedule({1, 2, 3, 4, 5, 6}, c, o);
  const Plan p = to_plan(s, 2, Timeline::kLockstep, 0.0);
  CHECK((p.first_rank == std::vector<int32_t>{0, 2, 1, 3, 2, 0}));
  CHECK((p.micro_batch == std::vector<int32_t>{0, 1, 0, 1, 1, 0}));
  CHECK(p.slots == 1);
  o.bucket_size = 6;  // the 9 and the 8 are sharded over their group, several micro-batches a rank
  const Schedule d = schedule({9, 1, 8, 2, 3, 1, 1}, c, o);
  CHECK(d.micro_batches.size() > 2 && std::count(d.cp_rank.begin(), d.cp_rank.end(), kDistributed) >= 2);
  for (Timeline t : {Timeline::kLockstep, Timeline::kFreeRunning}) {
    check_to_plan(s, 2, t);
    check_to_plan(d, 2, t);
  }
}

static void test_errors() {
  const CostModel c = toy();
  auto throws = [&](std::vector<int64_t> lengths, Options o, const std::string& needle) {
    try {
      schedule(lengths, c, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  Options o;
  CHECK(throws({1, 0}, o, "sequence 1 has length 0"));
  o.cp = 0;
  CHECK(throws({1}, o, "cp must be in [1, 65536], got 0"));
  Options over;
  over.cp = 2;
  over.bucket_size = 10;
  CHECK(throws({30}, over, "longer than the 20 tokens"));
  over.overlength = Overlength::kDrop;
  const Schedule d = schedule({30, 3}, c, over);
  CHECK((d.dropped == std::vector<int32_t>{0}) && d.dp_rank[0] == kDropped && d.dp_rank[1] == 0);
}

// pool_narrow (pool.hpp, step 4) by hand. Toy shape (kv_bytes(s) = 2 s), comm
// table collective_us(x) = x for x >= 1, two collectives per layer.
static CostModel comm_toy(double a_us_per_flop) {
  CostModel c = toy();
  c.a_us_per_flop = a_us_per_flop;
  c.comm.bytes = {1.0, 1000.0};
  c.comm.us = {1.0, 1000.0};
  return c;
}

// Two 8-token sequences sharded over CP 4 (shard 2 tokens a rank), nothing local.
static PlanMicroBatch two_sharded(const CostModel& c) {
  PlanMicroBatch mb;
  mb.seqs = {0, 1};
  mb.first_rank = {0, 0};
  mb.num_ranks = {4, 4};
  mb.rank_tokens = {4, 4, 4, 4};
  mb.comm_bytes = 2 * c.kv_bytes(8);
  mb.time_us = c.comm_us(mb.comm_bytes);  // 2 x 32 = 64: no compute cost
  return mb;
}

static void test_pool_narrow() {
  const std::vector<int64_t> lengths = {8, 8};
  std::vector<double> flops;
  detail::NarrowScratch w;
  {
    // Exchange only: the whole group costs 2 x (16 + 16) = 64 a rank. The first
    // sequence on ranks 0-1 moves 16 x (1/2)/(3/4) = 32/3 bytes there: 2 x (16 + 32/3)
    // = 53.3 on ranks 0-1, 32 on ranks 2-3. The second then goes to ranks 2-3
    // (block 0 would give 2 x (64/3) = 42.7): every rank 2 x 32/3 = 21.3.
    const CostModel c = comm_toy(0.0);
    detail::sequence_flops(lengths.data(), lengths.size(), c, flops);
    PlanMicroBatch mb = two_sharded(c);
    CHECK(detail::pool_narrow(mb, lengths, flops, c, 4, 100, w) == 2);
    CHECK((mb.first_rank == std::vector<int32_t>{0, 2}) && (mb.num_ranks == std::vector<int32_t>{2, 2}));
    CHECK((mb.rank_tokens == std::vector<int64_t>{4, 4, 4, 4}));  // shard of 8 over 2: 4 tokens
    CHECK(mb.comm_bytes == 2 * c.kv_bytes(8));                    // the real bytes, unscaled
    CHECK(std::abs(mb.time_us - 2.0 * 32.0 / 3.0) < 1e-12);
  }
  {
    // Same exchange, but compute at 1 us/FLOP (flops(8) = 448): a 2-rank shard
    // adds 112 us of compute a rank, far more than the exchange saves. Kept.
    const CostModel c = comm_toy(1.0);
    detail::sequence_flops(lengths.data(), lengths.size(), c, flops);
    PlanMicroBatch mb = two_sharded(c);
    mb.time_us = c.comm_us(mb.comm_bytes) + c.comp_us(2 * 448.0 / 4);
    const PlanMicroBatch before = mb;
    CHECK(detail::pool_narrow(mb, lengths, flops, c, 4, 100, w) == 0);
    CHECK(mb.first_rank == before.first_rank && mb.num_ranks == before.num_ranks && mb.time_us == before.time_us);
  }
  {
    // Memory: a 2-rank shard of 8 (4 tokens) beside the other's 2 needs 6 > bucket 5.
    const CostModel c = comm_toy(0.0);
    detail::sequence_flops(lengths.data(), lengths.size(), c, flops);
    PlanMicroBatch mb = two_sharded(c);
    CHECK(detail::pool_narrow(mb, lengths, flops, c, 4, 5, w) == 0);
    // No sub-group below CP 3, and none in a block of groups.
    mb = two_sharded(c);
    mb.groups = 2;
    CHECK(detail::pool_narrow(mb, lengths, flops, c, 4, 100, w) == 0);
  }
  {
    // The first case under whole_buffer: sub-group sets are not priced for a
    // kernel over the whole buffer, so nothing narrows.
    CostModel c = comm_toy(0.0);
    c.whole_buffer = true;
    detail::sequence_flops(lengths.data(), lengths.size(), c, flops);
    PlanMicroBatch mb = two_sharded(c);
    CHECK(detail::pool_narrow(mb, lengths, flops, c, 4, 100, w) == 0);
  }
}

// hedge.hpp by hand: comm_toy at 0.1 us/FLOP, CP 2, the shard sweep on.
// {1, 16} whole: rank 0 holds 16, 0.1 x flops(16) = 140.8. Sharded: 8 tokens a
// rank, 32 bytes gathered, 2 x 32 = 64 us of exchange beside 0.1 x flops(1) =
// 2.8 of local work, then 0.1 x 1408 / 2 = 70.4: 134.4. At plan_margin 2 the
// exchange is planned at 128 (198.4 sharded), so the sequence stays whole,
// and the plan is priced at 1x: 140.8.
static void test_hedge() {
  CostModel c = comm_toy(0.1);
  Options o;
  o.cp = 2;
  o.bucket_size = 100;
  o.dacp_search = DacpSearch::kShardSweep;
  const Schedule plain = schedule({1, 16}, c, o);
  CHECK((plain.cp_rank == std::vector<int32_t>{0, kDistributed}));
  CHECK(std::abs(plain.makespan_us - 134.4) < 1e-9);
  c.comm.plan_margin = 2.0;
  const Schedule hedged_plan = schedule({1, 16}, c, o);
  CHECK((hedged_plan.cp_rank == std::vector<int32_t>{0, 1}));
  CHECK(std::abs(hedged_plan.makespan_us - 140.8) < 1e-9);
  CHECK(hedged_plan.micro_batches[0].dacp.time_us == hedged_plan.makespan_us);
  // The planning model: the exchange at 2x, itself unhedged, nothing else changed.
  const CostModel p = planning_model(c);
  CHECK(p.comm.plan_margin == 1.0 && p.comm.collectives_per_layer == 4.0 && p.comm_us(32.0) == 128.0);
  CHECK(schedule({1, 16}, p, o).cp_rank == hedged_plan.cp_rank);
  // One micro-batch alone (dacp_for) and the pool choose alike.
  CHECK((dacp_for({1, 16}, c, o).cp_rank == std::vector<int32_t>{0, 1}));
  const Plan pool = schedule_pool({1, 16}, c, o);
  CHECK((pool.num_ranks == std::vector<int32_t>{1, 1}) && std::abs(pool.makespan_us - 140.8) < 1e-9);
  // Out of range: refused by name.
  c.comm.plan_margin = 0.5;
  bool named = false;
  try {
    schedule({1, 16}, c, o);
  } catch (const std::invalid_argument& e) {
    named = std::string(e.what()).find("comm.plan_margin must be finite and in [1, 10], got 0.5") != std::string::npos;
  }
  CHECK(named);
}

// Look-ahead on a toy step time (a step costs its longest sequence): two
// steps each with one long and one short sequence become one step with both
// long ones (the full sort), 18 -> 10. The long-first candidates equal
// arrival order here, so only the sort is screened and priced.
static void test_lookahead() {
  const CostModel c = toy();
  const Options o;
  const auto longest = [](const std::vector<int64_t>& l) {
    return static_cast<double>(*std::max_element(l.begin(), l.end()));
  };
  Lookahead a = lookahead({{9, 1}, {1, 9}}, c, o, longest);
  CHECK((a.step == std::vector<int32_t>{0, 1, 1, 0}));
  CHECK((a.steps() == std::vector<std::vector<int32_t>>{{0, 3}, {1, 2}}));
  CHECK((a.offsets == std::vector<int32_t>{0, 2, 4}));
  CHECK(a.arrival_window_us == 18.0 && a.window_us == 10.0);
  CHECK((a.step_us == std::vector<double>{9.0, 1.0}) && (a.arrival_us == std::vector<double>{9.0, 9.0}));
  CHECK(a.moved == 2 && a.max_delay == 1 && a.long_fraction == 1.0 && a.long_steps == 2);
  CHECK(a.screened == 1 && a.candidates == 2 && a.swaps == 0);
  // Arrival order (4 sequences), the sort (4), then the swap search's checks (4 each).
  CHECK(a.planned >= 8 && (a.planned - 8) % 4 == 0);
  // One batch, or nothing faster: arrival order.
  a = lookahead({{9, 1}}, c, o, longest);
  CHECK((a.step == std::vector<int32_t>{0, 0}) && a.moved == 0 && a.candidates == 1 && a.screened == 0);
  a = lookahead({{9, 9}, {1, 1}}, c, o, longest);
  CHECK((a.step == std::vector<int32_t>{0, 0, 1, 1}) && a.window_us == 10.0 && a.moved == 0);
  // Counts kept, an empty step allowed.
  a = lookahead({{5}, {}, {7, 7, 1}}, c, o, longest);
  CHECK(a.steps()[0].size() == 1 && a.steps()[1].empty() && a.steps()[2].size() == 3);
  bool named = false;
  try {
    lookahead({}, c, o, longest);
  } catch (const std::invalid_argument& e) {
    named = std::string(e.what()).find("lookahead window must hold 1 to 1024 global batches, got 0") !=
            std::string::npos;
  }
  CHECK(named);
}

// gds.hpp's LPT assignment, which split_over_dp and the pool's shares share.
// By hand: loads {5, 0, 2}; 4 (to bin 1: 0 -> 4), 3 (bin 2: 2 -> 5), 2 (bin 1:
// 4 -> 6), 1 (bin 0, the lowest of the 5s: 5 -> 6). Then the scan (<= 32 bins)
// and the heap (more) give what a plain restatement gives, ties included.
static void test_lpt_bins() {
  const std::vector<int32_t> order = {0, 1, 2, 3};
  const std::vector<double> weight = {4, 3, 2, 1};
  const auto bins = detail::lpt_bins(order, weight, {5, 0, 2});
  CHECK((bins == std::vector<std::vector<int32_t>>{{3}, {0, 2}, {1}}));
  for (const int32_t n : {7, 32, 33, 100}) {
    std::vector<int32_t> seqs(300);
    std::vector<double> w(seqs.size()), start(n);
    for (size_t k = 0; k < seqs.size(); ++k) {
      seqs[k] = static_cast<int32_t>(k);
      w[k] = static_cast<double>((k * 7919) % 13);  // small integers: many ties
    }
    for (int32_t i = 0; i < n; ++i) start[i] = static_cast<double>((i * 31) % 5);
    std::vector<std::vector<int32_t>> want(n);
    std::vector<double> load = start;
    for (int32_t k : seqs) {
      const auto t = std::min_element(load.begin(), load.end()) - load.begin();  // the first least
      want[t].push_back(k);
      load[t] += w[k];
    }
    CHECK(detail::lpt_bins(seqs, w, start) == want);
  }
}

// A step time the estimate cannot see: the estimate ranks the regroupings
// level with arrival order, the planner prices every one of them dearer. The
// answer is arrival order, priced by the planner: never predicted slower
// than W = 1.
static void test_lookahead_never_slower() {
  const CostModel c = toy();
  const Options o;
  const auto arrival_is_best = [](const std::vector<int64_t>& l) {
    // Cheap only for a step of one long and one short sequence (arrival order here).
    const bool mixed = l.size() == 2 && std::max(l[0], l[1]) == 9 && std::min(l[0], l[1]) == 1;
    return mixed ? 1.0 : 100.0;
  };
  const Lookahead a = lookahead({{9, 1}, {1, 9}, {9, 1}}, c, o, arrival_is_best);
  CHECK((a.step == std::vector<int32_t>{0, 0, 1, 1, 2, 2}) && a.moved == 0);
  CHECK(a.window_us == 3.0 && a.arrival_window_us == 3.0 && a.long_fraction == 0.0);
  CHECK(a.candidates >= 2 && a.swaps == 0);
}

// The estimate on hand-computed sums (step_estimate.hpp), and the k-th
// largest after a swap.
static void test_step_estimate() {
  CostModel c = toy();  // layers 1, a = 1, b = 0
  c.b_us = 2.0;
  c.micro_batch_fixed_us = 10.0;
  c.token_us = 0.5;
  c.step_fixed_us = 3.0;
  Options o;
  o.dp = 2;
  o.cp = 2;
  o.bucket_size = 4;  // capacity of a slot: 2 x 2 x 4 = 16 tokens
  const StepEstimator e(c, o);
  CHECK(e.groups() == 2 && e.cost(8.0) == 4.0);  // a x FLOPs / cp
  StepSketch s;
  e.add_descending(s, 6.0, 10);
  e.add_descending(s, 3.0, 5);
  e.add_descending(s, 2.0, 4);
  CHECK(s.count == 3 && s.work == 11.0 && s.tokens == 19.0 && s.c1 == 6.0 && s.cp_ == 3.0 && s.cp1 == 2.0);
  // work max(11/2, 6, 3+2) = 6; m = ceil(19/16) = 2 at 10 + 1 x 2 each; tokens 0.5 x 19 / 4; + 3.
  CHECK(e.us(s) == 6.0 + 2 * 12.0 + 0.5 * 19.0 / 4.0 + 3.0);
  CHECK(e.us(StepSketch()) == 0.0);
  const std::vector<double> d = {9.0, 7.0, 5.0, 3.0};
  CHECK(detail::kth_after_swap(d, 0, 0, 4.0) == 7.0);  // {7, 5, 4, 3}
  CHECK(detail::kth_after_swap(d, 2, 0, 4.0) == 4.0);
  CHECK(detail::kth_after_swap(d, 3, 0, 4.0) == 3.0);
  CHECK(detail::kth_after_swap(d, 0, 3, 10.0) == 10.0);  // {10, 9, 7, 5}
  CHECK(detail::kth_after_swap(d, 3, 3, 10.0) == 5.0);
  CHECK(detail::kth_after_swap(d, 1, 2, 5.0) == 7.0);  // the same multiset
  CHECK(detail::kth_after_swap(d, 4, 0, 1.0) == 0.0);  // past the end
}

// Chunked documents (chunked.hpp): the assignment, the timeline's after_us,
// GDS around them, the estimate and the look-ahead pricing them at their step.
static void test_chunked() {
  // LPT by hand: 3 (doc 1) -> 0, 3 (doc 3) -> 1, 2 (doc 0) -> 0 (tie to the lower: 5), 2 (doc 2) -> 1,
  // 2 (doc 4) -> 0: loads 7, 5. Round robin: 2 + 2 + 2 = 6 and 3 + 3 = 6.
  const std::vector<double> docs = {2, 3, 2, 3, 2};
  CHECK((assign_chunked(docs, 2) == std::vector<int32_t>{0, 0, 1, 1, 0}));
  CHECK((chunked_load(docs, assign_chunked(docs, 2), 2) == std::vector<double>{7, 5}));
  CHECK((assign_chunked({}, 3).empty()));
  CostModel c = toy();
  Options o;
  o.dp = 2;
  o.bucket_size = 100;
  o.timeline = Timeline::kFreeRunning;
  // Nothing but chunked documents: round robin's 6 beats LPT's 7, and is kept. Free-running at DP 2,
  // a rank with no micro-batch still runs one pad pass (data/steps/plan_buffers.py rank_buffers), the
  // toy's flops(1) = 28: 6 + 28 on each (the timeline left it out, 6).
  Schedule s = schedule({}, c, o, ChunkedDocs{docs, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}});
  CHECK((s.chunked_dp_rank == std::vector<int32_t>{0, 1, 0, 1, 0}) && s.makespan_us == 34.0);
  CHECK((s.dp_time_us == std::vector<double>{34, 34}) && s.micro_batches.empty());
  Plan p = to_plan(s, o.cp, o.timeline, c.pad_pass_us());
  CHECK((p.chunked_group == s.chunked_dp_rank) && p.makespan_us == 34.0 &&
        (p.group_time_us == std::vector<double>{34, 34}));
  // One long document on rank 0: both sequences go to rank 1 (flops 24 x 4 + 4 x 16 = 160 each), and
  // rank 0, with no micro-batch, runs its pad pass after the document: 1000 + 28 (was 1000).
  s = schedule({4, 4}, c, o, ChunkedDocs{{1000.0}, {1}, {1}, {1}});
  CHECK((s.chunked_dp_rank == std::vector<int32_t>{0}) && (s.dp_rank == std::vector<int32_t>{1, 1}));
  CHECK(s.makespan_us == 1028.0 && (s.dp_time_us == std::vector<double>{1028.0, 320.0}));
  CHECK(to_plan(s, o.cp, o.timeline, c.pad_pass_us()).makespan_us == 1028.0);
  // The timeline: free-running adds after_us to a rank's sum; lockstep waits for the largest after the slots.
  const std::vector<double> after = {3.0, 0.0};
  CHECK(step_time_us({{1, 2}, {4}}, Timeline::kFreeRunning, 0.5, 0.0, &after) == 6.0);
  // Free-running at DP > 1, a rank with no micro-batch pays its pad pass (0.5), where the step runs anything;
  // not at DP 1, nor in an empty step; the pool plans' replay likewise.
  CHECK(step_time_us({{1, 2}, {}}, Timeline::kFreeRunning, 5.0, 1.0) == 5.0 + 1.0);
  CHECK(step_time_us({{1, 2}, {}}, Timeline::kFreeRunning, 2.0, 1.0) == 3.0 + 1.0);
  CHECK(step_time_us({{}, {}}, Timeline::kFreeRunning, 2.0, 1.0) == 0.0);
  CHECK(step_time_us({{}}, Timeline::kFreeRunning, 2.0, 1.0, &after) == 3.0 + 1.0);
  {
    std::vector<double> free_at;
    CHECK(plan_step_time_us({{0, 0, 1, 3.0}}, 2, Timeline::kFreeRunning, 5.0, &free_at) == 5.0);
    CHECK((free_at == std::vector<double>{3.0, 5.0}));
    CHECK(plan_step_time_us({{0, 0, 2, 3.0}}, 2, Timeline::kFreeRunning, 5.0) == 3.0);
    CHECK(plan_step_time_us({{0, 0, 1, 3.0}}, 2, Timeline::kLockstep, 5.0) == 5.0);  // the slot's pad, as before
  }
  CHECK(step_time_us({{1, 2}, {4}}, Timeline::kLockstep, 0.5, 1.0, &after) == 4.0 + 2.0 + 3.0 + 1.0);
  CHECK(step_time_us({{}, {}}, Timeline::kLockstep, 0.5, 1.0, &after) == 4.0);
  // A bad time is named.
  bool named = false;
  try {
    schedule({4}, c, o, ChunkedDocs{{-1.0}, {1}, {1}, {1}});
  } catch (const std::invalid_argument& e) {
    named = std::string(e.what()).find("chunked document 0 has time") != std::string::npos;
  }
  CHECK(named);
  // The estimate: a step of one chunked document of 8 on 2 groups is max(8 / 2, 8), no micro-batch, + 3.
  CostModel e_cost = toy();
  e_cost.step_fixed_us = 3.0;
  const StepEstimator e(e_cost, o);
  StepSketch k;
  StepEstimator::add_chunked(k, 8.0, 1);
  CHECK(e.us(k) == 8.0 + 3.0);
  // The look-ahead prices each step with its chunked documents: step 0 holds one of 100, so its long
  // samples move to step 1 (a step's price: its longest sample plus its chunked time).
  const auto priced = [](const std::vector<int64_t>& l, const ChunkedDocs& d) {
    double t = 0.0;
    for (int64_t x : l) t = std::max(t, static_cast<double>(x));
    for (double x : d.us) t += x;
    return t;
  };
  const Lookahead a = lookahead({{9, 1}, {9, 1}}, {ChunkedDocs{{100.0}, {1}, {1}, {1}}, ChunkedDocs{}}, c, o, priced);
  CHECK(a.arrival_window_us == 118.0 && a.window_us == 110.0);
  CHECK(a.step_us[0] + a.step_us[1] == 110.0 && a.step_us[0] >= 100.0);
}

// assign_slots (slots.hpp) takes each slot's ranks off a min-heap on (load, rank); it must give what a
// scan of every rank gives (the least loaded untaken rank, ties to the lower), which it replaced for
// being O(dp^2) a slot. Random group times with many ties (a few values), empty groups, and a leader
// slot's loads, against the scan restated here.
static void test_assign_slots_is_the_scan() {
  uint64_t seed = 5;
  const auto next = [&seed]() {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return seed >> 33;
  };
  for (int rep = 0; rep < 300; ++rep) {
    const int32_t dp = 1 + static_cast<int32_t>(next() % 9);
    const size_t m = static_cast<size_t>(dp) * (1 + next() % 4);
    std::vector<double> us(m);
    std::vector<char> empty(m);
    for (size_t g = 0; g < m; ++g) {
      empty[g] = next() % 4 == 0;
      us[g] = empty[g] ? 0.0 : static_cast<double>(1 + next() % 3);
    }
    std::vector<double> load;
    if (next() % 2)
      for (int32_t i = 0; i < dp; ++i) load.push_back(static_cast<double>(next() % 3));
    std::vector<int32_t> rank, slot;
    assign_slots(us, empty, dp, rank, slot, load);
    // The scan: groups slowest first (non-empty first, stable), dp a slot, each to the least loaded
    // untaken rank, ties to the lower.
    std::vector<int32_t> order(m);
    for (size_t g = 0; g < m; ++g) order[g] = static_cast<int32_t>(g);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return empty[a] != empty[b] ? empty[a] < empty[b] : us[a] > us[b];
    });
    std::vector<double> l = load;
    l.resize(dp, 0.0);
    std::vector<int32_t> want_rank(m, -1), want_slot(m, -1);
    for (size_t first = 0, s = 0; first < m && !empty[order[first]]; first += dp, ++s) {
      std::vector<char> taken(dp, 0);
      for (size_t p = first; p < std::min(m, first + static_cast<size_t>(dp)); ++p) {
        int32_t best = -1;
        for (int32_t i = 0; i < dp; ++i)
          if (!taken[i] && (best < 0 || l[i] < l[best])) best = i;
        taken[best] = 1;
        want_rank[order[p]] = best;
        want_slot[order[p]] = static_cast<int32_t>(s);
        l[best] += us[order[p]];
      }
    }
    CHECK(rank == want_rank && slot == want_slot);
  }
}

// Lockstep's pad chunks (chunked.hpp): the passes per position, the pads per
// rank, their price in the step, the assignment choosing by it, and the estimate.
static void test_chunked_lockstep() {
  // Chunks 3, 5, 2 on ranks 0, 1, 0: positions [max(3, 5), 2] = [5, 2], 7 passes each;
  // rank 0 pads 7 - 5 = 2, rank 1 (its 5, then an all-pad document of 2) 7 - 5 = 2.
  CHECK((lockstep_passes({3, 5, 2}, {0, 1, 0}, 2) == std::vector<int32_t>{5, 2}));
  CHECK((lockstep_pads({3, 5, 2}, {0, 1, 0}, 2) == std::vector<int32_t>{2, 2}));
  CHECK((lockstep_pads({3}, {0}, 3) == std::vector<int32_t>{0, 3, 3}));
  CHECK((lockstep_passes({}, {}, 2).empty()) && (lockstep_pads({}, {}, 2) == std::vector<int32_t>{0, 0}));
  const ChunkedDocs docs{{6.0, 5.0, 2.0}, {3, 1, 1}, {3, 1, 1}, {1, 1, 1}};
  CHECK((chunked_after(docs.us, {0, 1, 1}, 2, Timeline::kLockstep, {1.0, 2.0}) == std::vector<double>{7, 9}));
  CHECK((chunked_after(docs.us, {0, 1, 1}, 2, Timeline::kFreeRunning, {1.0, 2.0}) == std::vector<double>{6, 7}));
  CHECK((chunked_after(docs.us, {0, 0, 0}, 1, Timeline::kLockstep, {0.0}) == std::vector<double>{13}));
  // The choice the pads change. LPT by time: 6 -> 0, 5 -> 1, 2 -> 1 (loads 6, 7); round robin: 6 and 2
  // on 0, 5 on 1 (loads 8, 5). Unpadded LPT's 7 beats 8. Lockstep: LPT's positions [3, 1] make rank 0
  // pad 4 - 3 = 1 and rank 1 4 - 2 = 2; round robin's make rank 0 pad none and rank 1 3. A pad chunk
  // (CostModel::pad_chunks_us) is here the layer call's intercept, a = 0, b = 1, no fixed cost: 1 for a
  // position's last pass, 4/3 for one before it, recomputed in backward (the pad pass's price, 1 each,
  // left that out); and a document with pads after it has its last chunk recomputed too, 1/3 more. LPT:
  // rank 0's all-pad position 1 (1), 7; rank 1's 2 pads after document 1, 4/3 + 1 + 1/3: 9 2/3. Round
  // robin: 8; rank 1 4/3 + 1 + 1/3 + 1 after its 5: 8 2/3, which wins (was 8 against 9).
  CostModel c = toy();
  c.a_us_per_flop = 0.0;
  c.b_us = 1.0;
  CHECK(c.pad_pass_us() == 1.0 && c.pad_chunks_us(0, 1, 1) == 1.0 && c.pad_chunks_us(5, 2, 1) == 1.0 + 4.0 / 3.0);
  const auto close = [](double x, double y) { return std::abs(x - y) <= 1e-12 * std::max(1.0, std::abs(y)); };
  const std::vector<double> lpt_pads = lockstep_pad_us(docs, {0, 1, 1}, 2, 1, c);
  CHECK(lpt_pads[0] == 1.0 && close(lpt_pads[1], 8.0 / 3.0));
  const double robin_1 = lockstep_pad_us(docs, {0, 1, 0}, 2, 1, c)[1];
  CHECK(close(robin_1, 11.0 / 3.0));
  Options o;
  o.dp = 2;
  o.bucket_size = 100;
  o.timeline = Timeline::kLockstep;
  o.slot_gds = true;
  Schedule s = schedule({}, c, o, docs);
  CHECK((s.chunked_dp_rank == std::vector<int32_t>{0, 1, 0}) && s.makespan_us == 5.0 + robin_1);
  CHECK((s.chunked_chunks == docs.chunks) && (s.dp_time_us == std::vector<double>{8, 5.0 + robin_1}));
  CHECK((s.chunked_lengths == docs.lengths) && (s.chunked_pad_us == std::vector<double>{0.0, robin_1}));
  Plan p = to_plan(s, o.cp, o.timeline, c.pad_pass_us());
  CHECK(p.makespan_us == s.makespan_us && (p.group_time_us == s.dp_time_us) && p.chunked_chunks == docs.chunks);
  c.b_us = 0.0;  // the pads priced at nothing: LPT
  CHECK(c.pad_pass_us() == 0.0);
  s = schedule({}, c, o, docs);
  CHECK((s.chunked_dp_rank == std::vector<int32_t>{0, 1, 1}) && s.makespan_us == 7.0);
  c.b_us = 1.0;
  o.timeline = Timeline::kFreeRunning;  // free-running ranks pad no chunk: LPT, each rank's one pad pass (1)
  s = schedule({}, c, o, docs);
  CHECK((s.chunked_dp_rank == std::vector<int32_t>{0, 1, 1}) && s.makespan_us == 8.0);
  // Under slot GDS round robin is LPT's plan retimed: the same micro-batches, with or without samples.
  o.timeline = Timeline::kLockstep;
  const std::vector<int64_t> samples = {30, 20, 10, 5, 5, 3};
  s = schedule(samples, c, o, docs);
  const Schedule none = schedule(samples, c, o);
  CHECK(s.dp_rank == none.dp_rank && s.micro_batch == none.micro_batch && s.cp_rank == none.cp_rank);
  CHECK((s.chunked_dp_rank == std::vector<int32_t>{0, 1, 0}) && s.makespan_us == none.makespan_us + 5.0 + robin_1);
  // A chunk count below 1, or one missing, is named.
  bool named = false;
  try {
    schedule({}, c, o, ChunkedDocs{{1.0, 2.0}, {1, 0}, {1, 1}, {1, 1}});
  } catch (const std::invalid_argument& e) {
    named = std::string(e.what()).find("chunked document 1 has 0 chunks") != std::string::npos;
  }
  CHECK(named);
  named = false;
  try {
    schedule({}, c, o, ChunkedDocs{{1.0, 2.0}, {}, {1, 1}, {1, 1}});
  } catch (const std::invalid_argument& e) {
    named = std::string(e.what()).find("0 chunk counts for 2 chunked documents") != std::string::npos;
  }
  CHECK(named);
  // The ranges that keep the pads and the times in their types. Two documents of 2^31 - 1 chunks at no
  // time both go to DP rank 0 (LPT's ties to the lower rank), and DP rank 1's pads, 2 x (2^31 - 1), wrapped
  // to -2 in int32 (its time the documents' less two pad passes); two of DBL_MAX us on one rank made its
  // time and the step infinite. Both are refused, by name, and the largest accepted count pads exactly.
  const auto refusal = [&](const ChunkedDocs& d) {
    try {
      schedule({5}, c, o, d);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const int32_t most = std::numeric_limits<int32_t>::max();
  CHECK(refusal(ChunkedDocs{{0.0, 0.0}, {most, most}, {1, 1}, {1, 1}}) ==
        "chunked documents have 4294967294 chunk passes in all, more than the limit 1073741824");
  const double huge = std::numeric_limits<double>::max();
  CHECK(refusal(ChunkedDocs{{huge, huge}, {1, 1}, {1, 1}, {1, 1}}) ==
        "chunked document 0 has time 1.79769e+308 us, above the limit 1e+60 us");
  CHECK((lockstep_pads({1 << 29, 1 << 29}, {0, 0}, 2) == std::vector<int32_t>{0, 1 << 30}));
  // Rank 1's 2^30 pads are priced in closed form: two all-pad positions of 2^29, each 2^29 - 1 recomputed
  // pads (4/3) and a last one (1).
  const std::vector<double> huge_pads =
      lockstep_pad_us(ChunkedDocs{{0.0, 0.0}, {1 << 29, 1 << 29}, {1, 1}, {1, 1}}, {0, 0}, 2, 1, c);
  CHECK(huge_pads[0] == 0.0 && huge_pads[1] == 2.0 * (1.0 + ((1 << 29) - 1) * (1.0 + 1.0 / 3.0)));
  // A pad chunk runs what a chunk of its document runs (pad_chunks_us): the toy (a = 1, b = 0, one layer,
  // CP 1, flops(s) = 24 s + 4 s^2) prices a pad after p tokens at flops(p + 1) - flops(p) = 28 + 8 p, 4/3 of
  // it where recomputed. LPT's ranks {0, 1, 1} (positions [3, 1]): rank 0's all-pad position, 28 (34);
  // rank 1 pads document 1 (1 token) twice, after 1 token (36, recomputed: 48) and after 2 (44, its
  // position's last), and recomputes the document's chunk (28 / 3): 5 + 2 + 101 1/3 (at a pad pass of 28
  // each, 63). Round robin's {0, 1, 0}: 8, and 5 + 101 1/3 + 28. LPT's 108 1/3. At a host floor of 40 a
  // layer call: rank 0 40, rank 1 4/3 x 40 + 44 + 40 / 3, LPT's 7 + 110 2/3 against round robin's
  // 155 2/3 (was 87 against 125).
  {
    CostModel t = toy();
    CHECK(t.pad_pass_us() == 28.0 && t.pad_chunks_us(1, 2, 1) == 92.0);
    Schedule q = schedule({}, t, o, docs);
    CHECK((q.chunked_dp_rank == std::vector<int32_t>{0, 1, 1}) && close(q.makespan_us, 7.0 + 92.0 + 28.0 / 3.0));
    CHECK(q.dp_time_us[0] == 6.0 + 28.0 && q.dp_time_us[1] == q.makespan_us);
    CHECK(q.chunked_pad_us[0] == 28.0 && close(q.chunked_pad_us[1], 92.0 + 28.0 / 3.0));
    CHECK(to_plan(q, o.cp, o.timeline, t.pad_pass_us()).makespan_us == q.makespan_us);
    t.host_floor_us = 40.0;
    q = schedule({}, t, o, docs);
    CHECK((q.chunked_dp_rank == std::vector<int32_t>{0, 1, 1}) &&
          close(q.makespan_us, 7.0 + 40.0 * (1.0 + 1.0 / 3.0) + 44.0 + 40.0 / 3.0));
  }
  // The estimate on lockstep: the documents after the samples' bound, padded. Documents 6 (3 chunks) and
  // 5 (1) on 2 groups, pad 1: max(6, max(3, ceil(4 / 2)) x 1 + (11 - 4) / 2) = 6.5 after the samples'
  // max(6 / 2, 6, 0) = 6, one micro-batch of 0 (fixed) + 1 (b) and 6 tokens at 0, + 0.
  const StepEstimator e(c, o);
  StepSketch k;
  e.add_descending(k, 6.0, 6);
  StepEstimator::add_chunked(k, 6.0, 3);
  StepEstimator::add_chunked(k, 5.0, 1);
  CHECK(e.us(k) == 6.0 + 6.5 + 1.0);
  o.timeline = Timeline::kFreeRunning;  // free-running: max((6 + 11) / 2, 6, 6) = 8.5 and the micro-batch
  CHECK(StepEstimator(c, o).us(k) == 8.5 + 1.0);
}

int main() {
  test_shards();
  test_attention_weight();
  test_dacp_cases();
  test_schedule_cases();
  test_to_plan();
  test_errors();
  test_pool_narrow();
  test_hedge();
  test_lookahead();
  test_lookahead_never_slower();
  test_step_estimate();
  test_lpt_bins();
  test_chunked();
  test_chunked_lockstep();
  test_assign_slots_is_the_scan();
  if (skrull_test::failures) return skrull_test::report();
  std::printf("test_core: all checks passed\n");
  return 0;
}
