// C++ unit tests of the core, without Python: hand-computed DACP and GDS
// cases, errors, determinism. Run by ctest (see .ci/run).
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "skrull/scheduler.hpp"

using namespace skrull;

// flops(s) = 24 s + 4 s^2, T_comp(F) = F, no communication cost.
static CostModel toy() {
  CostModel c;
  c.shape = {1, 1, 1, 1};
  c.a_us_per_flop = 1.0;
  c.b_us = 0.0;
  c.comm.bytes = {1.0};
  c.comm.us = {0.0};
  return c;
}

static void test_shards() {
  CHECK(shard_tokens(7, 2) == 4);
  CHECK(shard_tokens(9, 2) == 6);
  CHECK(shard_tokens(9, 1) == 9);
  CHECK(max_sequence_length(10, 4) == 40);
  CHECK(max_sequence_length(1, 4) == 1);
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

int main() {
  test_shards();
  test_dacp_cases();
  test_schedule_cases();
  test_errors();
  if (skrull_test::failures) return skrull_test::report();
  std::printf("test_core: all checks passed\n");
  return 0;
}
