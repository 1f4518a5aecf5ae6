// C++ unit tests of the cost model's whole_buffer, without Python: a rank's
// local part and its distributed part each priced as one sequence of its
// length (the CPU dense kernel's work), by scoring and by refinement. Run by
// ctest (see .ci/run).
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "toy.hpp"
#include "skrull/dacp.hpp"
#include "skrull/dacp_sweep.hpp"
#include "skrull/refine.hpp"

using namespace skrull;

using skrull_test::toy;  // flops(s) = 24 s + 4 s^2, T_comp(F) = F, no communication cost (toy.hpp)

// whole_buffer (a kernel over the rank's whole buffer, CPU dense): two
// documents of 3 and 5 tokens priced as one of 8 where they share a part,
// as two otherwise; flops(s) = 24 s + 4 s^2, T_comp = F, no exchange cost.
static void test_whole_buffer() {
  CostModel per_doc = toy();
  CostModel whole = toy();
  whole.whole_buffer = true;
  CHECK(per_doc.flops(3) + per_doc.flops(5) == 108.0 + 220.0);
  CHECK(whole.flops(8) == 448.0);
  CHECK(whole.local_flops(8, 328.0) == 448.0 && per_doc.local_flops(8, 328.0) == 328.0);
  CHECK(whole.dist_flops(8, 164.0, 2) == 224.0 && per_doc.dist_flops(8, 164.0, 2) == 164.0);
  // Both local on rank 0 of one: the sum per document, the buffer's square whole.
  CHECK(evaluate_placement({3, 5}, {0, 0}, per_doc, 1, 10).time_us == 328.0);
  CHECK(evaluate_placement({3, 5}, {0, 0}, whole, 1, 10).time_us == 448.0);
  // Both sharded over two ranks: each rank's queries over all gathered K/V.
  CHECK(evaluate_placement({3, 5}, {kDistributed, kDistributed}, per_doc, 2, 10).time_us == 164.0);
  CHECK(evaluate_placement({3, 5}, {kDistributed, kDistributed}, whole, 2, 10).time_us == 224.0);
  // One document a part: the same price either way.
  CHECK(evaluate_placement({3, 5}, {0, 1}, whole, 2, 10).time_us == 220.0);
  CHECK(evaluate_placement({3, 5}, {0, kDistributed}, whole, 2, 10).time_us == 108.0 + 110.0);
  // The plan follows the price: four documents of 4 on two ranks of 16. Per
  // document any 2 + 2 split ties; whole, Algorithm 1 puts two on each rank,
  // and refinement finds nothing better (moving one makes a buffer of 12).
  const DacpResult r = dacp({4, 4, 4, 4}, whole, 2, 16, Placement::kLeastLoad, Rollback::kLongest, true);
  CHECK(r.status == Status::kOk && r.time_us == whole.flops(8));
  CHECK(r.moves == 0);
  // Refinement prices a move as the buffer it makes (an exchange dear
  // enough that sharding never pays): five documents of 2 on rank 0 and
  // one of 7 on rank 1, bucket 10. Per document rank 1 is the bottleneck
  // (flops(7) = 364 > 5 x 64) and its 7 fits nowhere else: no move. Whole,
  // rank 0's buffer of 10 (640) is, and one 2 moved over gives 8 and 9
  // (448, 540).
  per_doc.comm.us = whole.comm.us = {1e6};
  const std::vector<int64_t> len = {2, 2, 2, 2, 2, 7};
  std::vector<double> fl;
  for (int64_t x : len) fl.push_back(whole.flops(x));
  const std::vector<int32_t> order = {0, 1, 2, 3, 4, 5};
  Workspace ws;
  std::vector<int32_t> at = {0, 0, 0, 0, 0, 1};
  CHECK(refine_placement(len.data(), fl.data(), len.size(), per_doc, 2, 10, order, ws, at.data()) == 0);
  CHECK(refine_placement(len.data(), fl.data(), len.size(), whole, 2, 10, order, ws, at.data()) == 1);
  CHECK((at == std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  CHECK(evaluate_placement(len, at, whole, 2, 10).time_us == 540.0);
}

// The host floor: a layer call costs max(floor, line); no call (0 FLOPs)
// costs nothing. The toy's 3 and 5 tokens take 108 and 220 FLOPs = us.
static void test_host_floor() {
  CostModel c = toy();
  CHECK(c.comp_us(108.0) == 108.0);  // floor 0: the line, as before
  c.host_floor_us = 300.0;
  CHECK(c.comp_us(108.0) == 300.0 && c.comp_us(448.0) == 448.0 && c.comp_us(0.0) == 0.0);
  // One each on two ranks: both at the floor. Together on one: 328 is above it.
  CHECK(evaluate_placement({3, 5}, {0, 1}, c, 2, 10).time_us == 300.0);
  CHECK(evaluate_placement({3, 5}, {0, 0}, c, 2, 10).time_us == 328.0);
  // Sharded: the distributed part runs in the same layer call, floored once
  // (164 -> 300); 3 local and 5 sharded: rank 0 runs 108 + 110 = 218 of
  // device time in one call, max(300, 218) = 300 (not 300 + 300: the floor
  // is per call, not per part), and rank 1 its share alone, 110 -> 300.
  CHECK(evaluate_placement({3, 5}, {kDistributed, kDistributed}, c, 2, 10).time_us == 300.0);
  CHECK(evaluate_placement({3, 5}, {0, kDistributed}, c, 2, 10).time_us == 300.0);
  // Above the floor the device's time shows: max(comm, line(local)) +
  // line(dist), not floored part by part (500 + 300 = 800 before).
  CHECK(c.layer_us(0.0, 500.0, 100.0) == 600.0 && c.layer_us(0.0, 100.0, 100.0) == 300.0);
  CHECK(c.layer_us(250.0, 0.0, 40.0) == 300.0 && c.layer_us(290.0, 0.0, 40.0) == 330.0);
  CHECK(c.layer_us(0.0, 0.0, 0.0) == 0.0 && c.line_us(108.0) == 108.0 && c.line_us(0.0) == 0.0);
  // c micro-batches cost at least c floors a layer and c fixed costs.
  c.micro_batch_fixed_us = 7.0;
  CHECK(c.floored_us(3.0) == 3.0 * (300.0 + 7.0));
  c.micro_batch_fixed_us = 0.0;
  // The lower bound holds it: at least one call at the floor (the line's
  // 328 / 2 = 164 alone is below it).
  CHECK(c.micro_batch_lower_bound_us(std::vector<int64_t>{3, 5}, 2) == 300.0);
  // The shard sweep's bound stays below what a candidate costs. CP 2,
  // bucket 6, lengths 4 and 5 (96 + 64 = 160 and 220 FLOPs), floor 200: the
  // candidate sharding the 5 (a shard of 4 a rank) leaves 2 tokens a rank,
  // so the fallback shards the 4 too, and both sharded cost one call, 200.
  // The bound is the line's, a R / cp + line(D) = 80 + 110 = 190, held up
  // to the floor once (the call's), 200; flooring the distributed part on
  // its own, 80 + 200 = 280, would be above it.
  c.host_floor_us = 200.0;
  CHECK(evaluate_placement({4, 5}, {kDistributed, kDistributed}, c, 2, 6).time_us == 200.0);
  CHECK(detail::sweep_bound(c, 2, c.comm_is_monotone(), c.kv_bytes(8), 110.0, 160.0, false, 160.0) == 200.0);
  // A bad floor is named with its range.
  c.host_floor_us = -1.0;
  bool threw = false;
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()) == "cost model: host_floor_us must be finite and in [0, 1e+09], got -1";
  }
  CHECK(threw);
}

// A lockstep pad pass (pad_pass_us): one local token a CP rank through
// every layer and the head, priced as micro_batch_us prices it, not the
// fixed cost alone. Toy: flops(1) = 28; 3 layers, b 2, fixed 5, 0.5 a token:
// 3 x (28 + 2) + 5 + 0.5 = 95.5; at a floor of 40 a layer, 3 x 40 + 5 + 0.5.
static void test_pad_pass() {
  CostModel c = toy();
  CHECK(c.pad_pass_us() == 28.0);  // the one layer's call alone: no fixed cost, no head
  c.shape.layers = 3;
  c.b_us = 2.0;
  c.micro_batch_fixed_us = 5.0;
  c.token_us = 0.5;
  CHECK(c.pad_pass_us() == 95.5);
  CHECK(c.pad_pass_us() == c.micro_batch_us({c.flops(1)}, 0.0, 0.0, 1));
  c.host_floor_us = 40.0;
  CHECK(c.pad_pass_us() == 125.5 && c.pad_pass_us() == c.micro_batch_us({c.flops(1)}, 0.0, 0.0, 1));
  // At least the floored fixed cost a micro-batch pays (floored_us), and the fixed cost.
  CHECK(c.pad_pass_us() >= c.floored_us(1.0) && c.pad_pass_us() > c.micro_batch_fixed_us);
}

// A chunk pass and a lockstep pad chunk (chunk_pass_us, pad_chunks_us): what train/chunked.py runs for a
// pad chunk at CP 2, not a pad pass. Toy: one layer, h = h_kv = 1 (flops(s) = 24 s + 4 s^2), a = 1, b = 0,
// every collective 5 us, 2 a layer. A pad chunk holds one token a rank (2 in all): after p tokens each
// rank computes (flops(p + 2) - flops(p)) / 2 = 32 + 8 p (its query over the p + 2 keys), its K/V is
// gathered (5) and its gradient reduce-scattered (5), and, recomputed, its forward (4/3 of the line) and
// its gather run again where the recompute gathers (chunk_regather, a traced chunk: 5): after 0 tokens
// 32 + 10 = 42 as a position's last pass, 32 x 4/3 + 15 recomputed (+ 10 eager, the forward's K/V reused);
// two pads after 6 tokens, 80 x 4/3 + 15 and 96 + 10. The pad pass priced each at flops(1) = 28.
static void test_pad_chunk() {
  CostModel c = toy();
  c.comm.us = {5.0};
  const auto close = [](double x, double y) { return std::abs(x - y) <= 1e-12 * std::max(1.0, std::abs(y)); };
  CHECK(c.pad_pass_us() == 28.0);
  CHECK(!c.chunk_regather);  // eager: the recompute gathers nothing
  CHECK(close(c.chunk_pass_us(0, 2, 2, true), 32.0 * 4.0 / 3.0 + 10.0));
  CHECK(close(c.pad_chunks_us(6, 2, 2), 80.0 * 4.0 / 3.0 + 10.0 + 106.0));
  c.chunk_regather = true;  // traced
  CHECK(c.chunk_pass_us(0, 2, 2, false) == 42.0 && c.pad_chunks_us(0, 1, 2) == 42.0);
  CHECK(close(c.chunk_pass_us(0, 2, 2, true), 32.0 * 4.0 / 3.0 + 15.0));
  CHECK(close(c.pad_chunks_us(6, 2, 2), 80.0 * 4.0 / 3.0 + 15.0 + 106.0));
  CHECK(c.chunk_pass_us(0, 1, 1, false) == c.pad_pass_us());  // CP 1, no prefix: the pad pass
  // dense (a rate per (query, key) pair): the 2 x (p + 2) rectangle, 24 + 4 (p + 2) a rank: 56 after 6.
  CHECK(c.chunk_pass_us(6, 2, 2, false, true) == 56.0 + 10.0);
  // The host floor holds each pass's call (4/3 of it where recomputed); a fixed cost and the head per pass.
  c.host_floor_us = 100.0;
  c.micro_batch_fixed_us = 7.0;
  c.token_us = 0.5;
  CHECK(c.pad_chunks_us(0, 1, 2) == 100.0 + 0.5 + 7.0);
  CHECK(close(c.pad_chunks_us(0, 3, 2), 2.0 * (100.0 * 4.0 / 3.0 + 0.5 * 4.0 / 3.0 + 7.0) + 100.0 + 0.5 + 7.0));
  // The closed form equals the passes summed, floor and line mixed (pads 0-17 at the floor, the rest on the line).
  c.host_floor_us = 400.0;
  double sum = 0.0;
  for (int64_t j = 0; j < 40; ++j) sum += c.chunk_pass_us(10 + 2 * j, 2, 2, j < 39);
  CHECK(close(c.pad_chunks_us(10, 40, 2), sum));
}

int main() {
  test_pad_chunk();
  test_whole_buffer();
  test_host_floor();
  test_pad_pass();
  if (skrull_test::failures) return skrull_test::report();
  std::printf("test_cost_model: all checks passed\n");
  return 0;
}
