// Fuzz target over the core's public entry points: skrull::schedule,
// skrull::schedule_pool, skrull::lookahead, skrull::dacp, dacp_for,
// dacp_sweep and evaluate_placement. The input bytes are
// decoded into lengths, options and cost coefficients, biased towards the
// values that matter: 0, negatives, the int64 limits, kMax* and kMax* + 1,
// BucketSize, BucketSize x CP, the over-length limit and its neighbours,
// NaN, inf, huge and negative coefficients, runs of tens of thousands of
// equal lengths.
//
// After the lengths (and a schedule's chunked documents), a tail that older
// corpus inputs end before: whole_buffer, the fixed costs (a micro-batch, a
// step), the head and the attention weight, and for a schedule slot GDS, the
// timeline and chunked documents' extreme chunk counts and times; then the
// tensor-parallel degree; then, for a schedule, the pool's byte: whether
// schedule_pool plans the same batch too, comm.cross_group_factor,
// Options::pool_widen, and collectives_per_layer x plan_margin at its top;
// then the look-ahead's byte: where it is not 0, the batch becomes a window
// of W global batches (W 0..8, 16, kMaxLookahead and one more, one sample a
// batch; cut evenly, all in one, by counts read from the input, or round
// robin), the chunked documents handed to its batches (or in W + 1 lists),
// regrouped by skrull::lookahead with schedule() or schedule_pool() as the
// step planner.
//
// Every input must end in either a valid plan (plan_check.hpp, the C++ twin
// of Plan.validate, restating each rank's time and the step on its timeline
// with pad passes and pad chunks) or std::invalid_argument with a message,
// and exactly when the documented ranges say so; anything else traps. Also
// checked: the same input gives the same plan bit for bit, evaluate_placement
// agrees with dacp and re-prices every micro-batch of a plan to the bit, the
// plan as a Plan (to_plan) has the schedule's step time, pad chunks are
// never negative and make every lockstep rank run the same passes,
// whole_buffer never prices a placement below per document, and no plan
// beats the cost model's lower bound. A pool plan must satisfy pool_check.hpp
// (rank sets, tokens, the timeline replayed), keep its times when re-priced,
// and be no slower than skrull's schedule where every sequence fits a group.
// A window must be refused exactly as lookahead_check.hpp's restated ranges
// say (the window's, then each arrival step's as its planner's), else every
// step the look-ahead plans is a valid plan, every sample is at one step,
// each step keeps its arrival count, delays stay within W - 1, every price
// in the answer is its step's full plan re-planned to the bit, the window
// is never predicted slower than arrival order, `planned` is the sequences
// the planner was given, the counters stay within their budgets, and the
// same window gives the same answer bit for bit.
//
// Built with libFuzzer (-DSKRULL_FUZZ=ON, Clang; tools/fuzz.sh), or with
// -DSKRULL_FUZZ_REPLAY as a plain program that runs the files it is given
// (ctest replays the committed corpus, cpp/fuzz/corpus, with any compiler).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../tests/lookahead_check.hpp"
#include "../tests/plan_check.hpp"
#include "../tests/pool_check.hpp"
#include "skrull/dacp_sweep.hpp"
#include "skrull/lookahead.hpp"
#include "skrull/plan.hpp"
#include "skrull/pool.hpp"
#include "skrull/scheduler.hpp"

using namespace skrull;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fuzz_core: %s\n", what.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

// Reads little-endian values from the input; zeros once it runs out.
class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint64_t raw(int bytes) {
    uint64_t v = 0;
    for (int b = 0; b < bytes; ++b) v |= static_cast<uint64_t>(u8()) << (8 * b);
    return v;
  }
  bool left() const { return i_ < n_; }

 private:
  const uint8_t* p_;
  size_t n_, i_ = 0;
};

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

int32_t rank_count(Bytes& in) {
  const uint8_t sel = in.u8();
  if (sel < 200) return 1 + sel % 9;  // 1..9: the usual group sizes
  const int32_t special[] = {0, -1, 16, 64, kMaxRanks, kMaxRanks + 1, std::numeric_limits<int32_t>::min(),
                             std::numeric_limits<int32_t>::max()};
  if (sel < 200 + 8 * 6) return special[(sel - 200) % 8];
  return static_cast<int32_t>(in.raw(4));
}

int64_t bucket_size(Bytes& in) {
  const uint8_t sel = in.u8();
  if (sel < 160) return 1 + (sel % 64) * (sel % 3 == 0 ? 1 : 97);  // small, odd and even
  const int64_t special[] = {0, -1, 1, 2, 3, 26624, 13312, kMaxBucketSize, kMaxBucketSize + 1, kI64Max, kI64Min};
  if (sel < 160 + 11 * 8) return special[(sel - 160) % 11];
  return static_cast<int64_t>(in.raw(8));
}

double coefficient(Bytes& in, double typical) {
  const uint8_t sel = in.u8();
  if (sel < 128) return typical;
  const double special[] = {0.0,   -0.0,  1e-9, 1.0,   1.0000001, 1e9,   1e9 + 1, 1e300,
                            -1.0,  4e-320, std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(), std::nan(""), typical * 1e6};
  if (sel < 128 + 14 * 8) return special[(sel - 128) % 14];
  const uint64_t bits = in.raw(8);
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

CostModel cost_model(Bytes& in) {
  CostModel c;  // preset: qwen2.5-0.5b, assumed H100
  c.shape = {24, 896, 128, 2};
  c.a_us_per_flop = 7.5e-9;
  c.b_us = 30.0;
  const uint8_t shape = in.u8();
  if (shape & 1) c.shape.layers = static_cast<int32_t>(in.raw(4)) % (2 * kMaxLayers + 3) - 1;
  if (shape & 2) c.shape.hidden = static_cast<int64_t>(in.raw(3)) - 2;
  if (shape & 4) c.shape.kv_width = (shape & 64) ? kMaxWidth + (shape & 128 ? 1 : 0) : 1;
  if (shape & 8) c.shape.bytes_per_elem = static_cast<int32_t>(in.u8() % 19) - 1;
  if (shape & 16) c.shape = {kMaxLayers, kMaxWidth, kMaxWidth, 16};  // every FLOP at its largest
  c.a_us_per_flop = coefficient(in, 7.5e-9);
  c.b_us = coefficient(in, 30.0);
  // Comm table: 0..11 points (sometimes one latency short), ascending by a
  // drawn step (sometimes under a byte, sometimes backwards).
  const uint8_t points = in.u8();
  const size_t n = points % 12;
  double x = (points & 0x80) ? 0.0 : 2097152.0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t step = in.u8();
    x += step < 200 ? 1.0 + step * 1e6 : (step < 230 ? 0.5 : (step < 250 ? -1.0 : coefficient(in, 1.0)));
    c.comm.bytes.push_back(x);
    c.comm.us.push_back(step % 4 == 0 ? coefficient(in, 100.0) : 50.0 + 40.0 * static_cast<double>(i));
  }
  if ((points & 0x70) == 0x70 && !c.comm.us.empty()) c.comm.us.pop_back();
  const uint8_t extra = in.u8();
  if (extra & 1) c.comm.threshold_bytes = coefficient(in, 1e6);
  if (extra & 2) c.comm.floor_us = coefficient(in, 40.0);
  if (extra & 4) c.comm.collectives_per_layer = coefficient(in, 2.0);
  if (extra & 8) c.comm.plan_margin = coefficient(in, 1.5);  // hedged: plan with one model, price with another
  if (extra & 16) c.host_floor_us = coefficient(in, 4000.0);  // a layer call at max(floor, line): run 9's 4.34 ms
  return c;
}

// One length, relative to the group's figures (clamped into the accepted
// ranges first, so the arithmetic here cannot overflow; out-of-range
// options are refused before lengths matter).
int64_t length(Bytes& in, int64_t bucket_in, int32_t cp_in) {
  const int64_t bucket = std::min<int64_t>(std::max<int64_t>(bucket_in, 1), kMaxBucketSize);
  const int32_t cp = std::min<int32_t>(std::max<int32_t>(cp_in, 1), kMaxRanks);
  const int64_t limit = check::limit_of(bucket, cp);
  const uint8_t sel = in.u8();
  if (sel < 96) return 1 + in.u8();                          // short
  if (sel < 128) return 1 + static_cast<int64_t>(in.raw(2));  // up to 64K
  switch (sel % 24) {
    case 0: return 0;
    case 1: return -1;
    case 2: return bucket;
    case 3: return bucket + 1;
    case 4: return bucket - 1;
    case 5: return bucket * static_cast<int64_t>(cp);
    case 6: return limit;
    case 7: return limit + 1;
    case 8: return limit - 1;
    case 9: return bucket / cp + 1;  // just above BucketSize / N
    case 10: return 2 * bucket / cp + 1;
    case 11: return kMaxLength;
    case 12: return kMaxLength + 1;
    case 13: return kI64Max;
    case 14: return kI64Min;
    case 15: return 2;
    case 16: return 3;
    case 17: return 2 * static_cast<int64_t>(cp) + 1;  // one past a zigzag multiple
    case 18: return bucket / 2 + 1;
    default: return static_cast<int64_t>(in.raw(sel % 2 ? 4 : 8));
  }
}

// Work cap per input, so one execution stays well under a second: the core
// is O(n (cp + log n)) per split, bounded but not small at n = 50K, cp = 65K.
constexpr int64_t kMaxWork = 2'000'000;

// A leading 254 allows tens of thousands of lengths (else 2,000, which
// keeps most executions fast); 255 asks for kMaxSequences + 1, 253 for
// just too many sequences x CP ranks.
std::vector<int64_t> lengths(Bytes& in, int64_t bucket, int32_t cp) {
  std::vector<int64_t> out;
  const uint8_t size = in.u8();
  if (size == 255) {  // one more than kMaxSequences: refused before any work
    out.assign(static_cast<size_t>(kMaxSequences) + 1, 1);
    return out;
  }
  const int64_t width = std::min<int64_t>(std::max<int64_t>(cp, 1), kMaxRanks);
  if (size == 253) {  // one more than kMaxSequenceRanks / cp (or than kMaxSequences): refused
    out.assign(static_cast<size_t>(std::min(kMaxSequenceRanks / width, kMaxSequences) + 1), 1);
    return out;
  }
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(size == 254 ? 40'000 : 2'000, kMaxWork / width));
  while (in.left() && static_cast<int64_t>(out.size()) < cap) {
    const uint8_t op = in.u8();
    if (op == 199) break;  // end of the lengths (more bytes follow)
    if (op < 200) {        // one length
      out.push_back(length(in, bucket, cp));
    } else {  // a run of equal lengths: up to 64K copies
      const int64_t run = std::min<int64_t>(cap - static_cast<int64_t>(out.size()), 1 + static_cast<int64_t>(in.raw(2)));
      out.insert(out.end(), run, length(in, bucket, cp));
    }
  }
  return out;
}

// Digit 0..max+2 -> an enum value: valid up to max, then max+1 and -1.
template <typename E>
E enum_value(int digit, int max) {
  return static_cast<E>(digit <= max + 1 ? digit : -1);
}

uint64_t digest(const Schedule& s) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  add(s.cp_rank.data(), s.cp_rank.size() * 4);
  add(s.micro_batch.data(), s.micro_batch.size() * 4);
  add(s.dp_rank.data(), s.dp_rank.size() * 4);
  add(s.dp_time_us.data(), s.dp_time_us.size() * 8);
  return h;
}

// DacpSearch (one invalid value each way) and sweep_margin (edges, NaN).
void search_options(Bytes& in, Options& o) {
  const uint8_t x = in.u8();
  o.dacp_search = enum_value<DacpSearch>(x % 4, 1);
  const double margins[] = {0.0, 0.5, 100.0, 100.0001, -0.1, std::nan(""), std::numeric_limits<double>::infinity()};
  if (x / 4 >= 48) o.sweep_margin = margins[(x / 4 - 48) % 7];
}

// The step's chunked documents (overlength "chunk", chunked.hpp), read after the lengths: none
// where the input ends there (every older corpus entry), else up to 4, a bad time among them refused;
// each one's byte gives its time (mod 9) and its chunk passes (1 + its ninths mod 8: lockstep's pads).
ChunkedDocs chunked_times(Bytes& in) {
  const double times[] = {0.0, 1.0, 1e3, 1e6, 1e9, 3e7, std::nan(""), -1.0, std::numeric_limits<double>::infinity()};
  ChunkedDocs out;
  out.us.resize(in.u8() % 5);
  for (double& t : out.us) {
    const uint8_t b = in.u8();
    t = times[b % 9];
    out.chunks.push_back(1 + (b / 9) % 8);
    out.lengths.push_back(1 + 97 * int64_t{b});  // where its lockstep pads start (no byte of its own)
    out.last_chunk.push_back(1 + (31 * int64_t{b}) % out.lengths.back());
  }
  return out;
}

// The tail (none where the input ends before it: every older corpus entry). Its first byte:
// whole_buffer (bit 0); for a schedule, slot GDS (bit 1) and the timeline (bits 2-3: lockstep,
// free-running, then two unknown values); a micro-batch's fixed cost (bit 4), a step's (bit 5), the
// head's per-token time and the attention weight (bit 6); with bit 7 each chunked document reads
// one more byte: an extreme chunk count (bits 0-2) and time (bits 3-5), or its own where 0.
// Then one byte more (0 where the input ends): the tensor-parallel degree (its bits 0-2: 1, 2, 4,
// 7, 1024, 1025, 0, -1), which divides each rank's FLOPs and K/V bytes.
void tail(Bytes& in, CostModel& c, Options* o = nullptr, ChunkedDocs* docs = nullptr) {
  const uint8_t t = in.u8();
  c.whole_buffer = t & 1;
  if (t & 16) c.micro_batch_fixed_us = coefficient(in, 100.0);
  if (t & 32) c.step_fixed_us = coefficient(in, 500.0);
  if (t & 64) {
    c.token_us = coefficient(in, 0.01);
    c.attention_weight = coefficient(in, 0.52);
  }
  if (o != nullptr) {
    o->slot_gds = t & 2;
    o->timeline = enum_value<Timeline>((t >> 2) & 3, 1);
  }
  if (o != nullptr && (t & 128)) {
    const int32_t chunks[] = {0, -1, 1 << 20, 1 << 30, std::numeric_limits<int32_t>::max(),
                              std::numeric_limits<int32_t>::min(), 2};
    const double times[] = {1e50, 1e300, std::numeric_limits<double>::max(), 4e-320, -0.0, 1e-300, 7e15};
    for (size_t k = 0; k < docs->size(); ++k) {
      const uint8_t b = in.u8();
      if (b & 7) docs->chunks[k] = chunks[(b & 7) - 1];
      if ((b >> 3) & 7) docs->us[k] = times[((b >> 3) & 7) - 1];
    }
  }
  const int32_t tp[] = {1, 2, 4, 7, kMaxTensorParallel, kMaxTensorParallel + 1, 0, -1};
  c.shape.tp = tp[in.u8() & 7];
}

// The pool's byte, after the tail's (0 where the input ends: every older corpus entry): bit 0
// plans the same batch with schedule_pool too (fuzz_pool); bits 1-3 draw comm.cross_group_factor
// (the default 9, its range's ends 1 and 1000, 1.5, the next doubles outside each end, NaN, or
// any coefficient), bits 4-6 Options::pool_widen (the default 1, 0, 0.5, its top 1e6 and the next
// double past it, -0.0, NaN, 1e-3). With bit 7 one more byte sets collectives_per_layer and
// plan_margin at the top of their product (1e3) or just past it. schedule() validates all of
// them, so a value out of range is refused by both.
bool pool_options(Bytes& in, CostModel& c, Options& o) {
  const uint8_t p = in.u8();
  const double inf = std::numeric_limits<double>::infinity();
  const double cross[] = {9.0, 1.0, 1e3, 1.5, std::nextafter(1.0, 0.0), std::nextafter(1e3, inf), std::nan(""), 0.0};
  const int x = (p >> 1) & 7;
  c.comm.cross_group_factor = x == 7 ? coefficient(in, 9.0) : cross[x];
  const double widen[] = {1.0, 0.0, 0.5, 1e6, std::nextafter(1e6, inf), -0.0, std::nan(""), 1e-3};
  o.pool_widen = widen[(p >> 4) & 7];
  if (p & 128) {
    const double top[][2] = {{125.0, 8.0}, {std::nextafter(125.0, inf), 8.0}, {1e3, 1.0}, {1e3, std::nextafter(1.0, inf)}};
    const uint8_t q = in.u8() % 4;
    c.comm.collectives_per_layer = top[q][0];
    c.comm.plan_margin = top[q][1];
  }
  return p & 1;
}

// schedule_pool on a schedule input's lengths, options and cost model (no chunked documents: the
// pool takes none). It must refuse exactly what pool_rejection says, else return a plan
// pool_check.hpp finds sound; re-priced under its own model (reprice_pool_plan: a wide
// micro-batch at the cross-group factor) it keeps every time to the bit; where every sequence
// fits a CP group it is no slower than skrull's schedule; the same input gives the same plan.
void fuzz_pool(const std::vector<int64_t>& ls, const CostModel& c, const Options& o, bool twice) {
  const std::string reject = check::pool_rejection(ls, c, o);
  // Work cap as the lengths' (sequences x world); a refusal costs no planning.
  const __int128 work = static_cast<__int128>(ls.size()) * o.dp * o.cp;
  if (reject.empty() && work > kMaxWork) return;
#ifdef SKRULL_FUZZ_REPLAY
  if (std::getenv("SKRULL_FUZZ_VERBOSE"))
    std::fprintf(stderr, "pool n=%zu dp=%d cp=%d cross=%g widen=%g margin=%g reject=%s\n", ls.size(), o.dp, o.cp,
                 c.comm.cross_group_factor, o.pool_widen, c.comm.plan_margin, reject.c_str());
#endif
  Plan p;
  try {
    p = schedule_pool(ls, c, o);
  } catch (const std::invalid_argument& ex) {
    if (reject.empty()) die(std::string("schedule_pool refused an acceptable input: ") + ex.what());
    if (std::strlen(ex.what()) < 10) die("schedule_pool: invalid_argument without a message");
    return;
  }
  if (!reject.empty()) die("schedule_pool accepted an input outside the ranges: " + reject);
  const std::string err = check::pool_error(ls, c, o, p);
  if (!err.empty()) die("bad pool plan: " + err);
  Plan again = p;
  detail::reprice_pool_plan(again, c, o);
  for (size_t m = 0; m < p.micro_batches.size(); ++m)
    if (again.micro_batches[m].time_us != p.micro_batches[m].time_us) die("a pool micro-batch's price is not its own");
  if (again.makespan_us != p.makespan_us) die("the pool plan re-priced has another step time");
  bool fits = true;
  for (int64_t s : ls) fits = fits && s <= check::limit_of(o.bucket_size, o.cp);
  if (fits && !(p.makespan_us <= schedule(ls, c, o).makespan_us * (1 + 1e-12)))
    die("the pool plan is predicted slower than skrull's");
  if (twice) {
    const Plan q = schedule_pool(ls, c, o);
    if (q.makespan_us != p.makespan_us || q.micro_batch != p.micro_batch || q.first_rank != p.first_rank ||
        q.num_ranks != p.num_ranks || q.group_time_us != p.group_time_us)
      die("same input, different pool plan");
  }
}

// Work cap of one window: the full plans lookahead may make (arrival order and the first finalist,
// 2n sequences over 2W steps, then kLookaheadPlanWork sequences in steps of at least one), each
// O(cp + dp) a sequence or a step, the world's for the pool; and its screening, O(n + W) for each of
// the up to 5W + 1 candidates. Counted for the two calls when the input asks for both.
constexpr int64_t kMaxWindowWork = 20'000'000;

// The look-ahead's byte, after the pool's (0 where the input ends: every older corpus entry).
// Nonzero: the schedule input's lengths, cost model and options become a window of W global batches
// (one more byte: 1..8, or 0, 16, kMaxLookahead, kMaxLookahead + 1, one sample a batch) regrouped by
// skrull::lookahead with schedule() (or, bit 4, schedule_pool()) as its step planner. Bits 0-1 cut
// the lengths into the batches: evenly in arrival order, all in the last batch (the others empty),
// each batch's count read from the input (one byte each, the rest to the last), or round robin.
// Bits 2-3 give the schedule's chunked documents to the window: none, all to batch 0, round robin,
// or in W + 1 lists (refused); the pool takes none. It must refuse exactly what
// check::lookahead_rejection says, else answer what check::lookahead_error finds sound, with every
// step it plans a valid plan (plan_check.hpp, pool_check.hpp) and its `planned` the sequences its
// planner was given; the same input gives the same answer.
void fuzz_lookahead(Bytes& in, uint8_t la, const std::vector<int64_t>& ls, const CostModel& c, const Options& o,
                    const ChunkedDocs& docs, bool twice) {
  const bool pool = la & 16;
  const uint8_t wb = in.u8();
  const size_t n = ls.size();
  const int32_t one_each = static_cast<int32_t>(std::min<size_t>(std::max<size_t>(n, 1), kMaxLookahead));
  const int32_t special[] = {0, 16, kMaxLookahead, kMaxLookahead + 1, one_each};
  const int32_t w = wb < 200 ? 1 + wb % 8 : special[(wb - 200) % 5];
  std::vector<std::vector<int64_t>> batches(w);
  if (w > 0) {
    switch (la & 3) {
      case 0:  // evenly, in arrival order
        for (int32_t b = 0; b < w; ++b)
          batches[b].assign(ls.begin() + static_cast<int64_t>(n * b / w), ls.begin() + static_cast<int64_t>(n * (b + 1) / w));
        break;
      case 1:
        batches[w - 1] = ls;
        break;
      case 2: {  // counts from the input
        size_t at = 0;
        for (int32_t b = 0; b + 1 < w; ++b) {
          const size_t k = std::min<size_t>(n - at, in.u8());
          batches[b].assign(ls.begin() + at, ls.begin() + at + k);
          at += k;
        }
        batches[w - 1].assign(ls.begin() + at, ls.end());
        break;
      }
      default:
        for (size_t i = 0; i < n; ++i) batches[i % w].push_back(ls[i]);
    }
  }
  std::vector<ChunkedDocs> chunked;
  const int chunk_mode = pool ? 0 : (la >> 2) & 3;
  if (chunk_mode != 0) chunked.resize(chunk_mode == 3 ? w + 1 : w);
  for (size_t k = 0; k < docs.size() && !chunked.empty(); ++k) {
    ChunkedDocs& to = chunked[chunk_mode == 2 ? k % chunked.size() : 0];
    to.us.push_back(docs.us[k]);
    to.chunks.push_back(docs.chunks[k]);
    to.lengths.push_back(docs.lengths[k]);
    to.last_chunk.push_back(docs.last_chunk[k]);
  }
  const std::string reject =
      check::lookahead_rejection(batches, chunked, c, [&](const std::vector<int64_t>& l, const ChunkedDocs& d) {
        if (pool) return check::pool_rejection(l, c, o);
        const std::string r = check::schedule_rejection(l, c, o);
        return r.empty() ? check::chunked_rejection(d.us, d.chunks) : r;
      });
  const __int128 steps = 2 * static_cast<__int128>(w) + 2 * static_cast<__int128>(n) + kLookaheadPlanWork;
  const __int128 per = pool ? static_cast<__int128>(o.dp) * o.cp : static_cast<__int128>(o.dp) + o.cp;
  const __int128 work = (twice ? 2 : 1) * (steps * per + 6 * static_cast<__int128>(w) * (n + w));
  if (reject.empty() && work > kMaxWindowWork) return;
#ifdef SKRULL_FUZZ_REPLAY
  if (std::getenv("SKRULL_FUZZ_VERBOSE"))
    std::fprintf(stderr, "lookahead n=%zu w=%d split=%d chunked=%zu pool=%d reject=%s\n", n, w, la & 3,
                 chunked.size(), int(pool), reject.c_str());
#endif
  int64_t planned = 0;  // sequences the step planner was given
  const auto step_time = [&](const std::vector<int64_t>& l, const ChunkedDocs& d) {
    planned += static_cast<int64_t>(l.size());
    if (pool) {
      const Plan p = schedule_pool(l, c, o);
      const std::string err = check::pool_error(l, c, o, p);
      if (!err.empty()) die("lookahead's step planner: bad pool plan: " + err);
      return p.makespan_us;
    }
    const Schedule s = schedule(l, c, o, d);
    const std::string err = check::schedule_error(l, c, o, s);
    if (!err.empty()) die("lookahead's step planner: bad plan: " + err);
    return s.makespan_us;
  };
  Lookahead a;
  try {
    a = lookahead(batches, chunked, c, o, step_time);
  } catch (const std::invalid_argument& ex) {
    if (reject.empty()) die(std::string("lookahead refused an acceptable window: ") + ex.what());
    if (std::strlen(ex.what()) < 10) die("lookahead: invalid_argument without a message");
    return;
  }
  if (!reject.empty()) die("lookahead accepted a window outside the ranges: " + reject);
  if (a.planned != planned) die("lookahead's planned is not the sequences it planned");
  const std::string err = check::lookahead_error(batches, chunked, a, [&](const std::vector<int64_t>& l, const ChunkedDocs& d) {
    return pool ? schedule_pool(l, c, o).makespan_us : schedule(l, c, o, d).makespan_us;
  });
  if (!err.empty()) die("bad lookahead answer: " + err);
#ifdef SKRULL_FUZZ_REPLAY
  if (std::getenv("SKRULL_FUZZ_VERBOSE"))
    std::fprintf(stderr, "lookahead moved=%d candidates=%d screened=%d swaps=%d swap_trials=%lld planned=%lld x%.4f\n",
                 a.moved, a.candidates, a.screened, a.swaps, static_cast<long long>(a.swap_trials),
                 static_cast<long long>(a.planned), a.arrival_window_us / a.window_us);
#endif
  if (twice && !check::same_lookahead(lookahead(batches, chunked, c, o, step_time), a))
    die("same window, different lookahead answer");
}

void fuzz_schedule(Bytes& in, bool twice) {
  Options o;
  o.dp = rank_count(in);
  o.cp = rank_count(in);
  o.bucket_size = bucket_size(in);
  const uint8_t e = in.u8();
  o.placement = enum_value<Placement>(e % 4, 1);
  o.rollback = enum_value<Rollback>((e / 4) % 4, 1);
  o.micro_batch_count = enum_value<MicroBatchCount>((e / 16) % 4, 1);
  o.refine = e & 0x80;
  o.overlength = enum_value<Overlength>(in.u8() % 5, 2);
  const uint8_t w = in.u8();
  o.max_extra_micro_batches = w < 250 ? w % 8 : (w == 250 ? 1024 : (w == 251 ? 1025 : -1));
  search_options(in, o);
  CostModel c = cost_model(in);
  const std::vector<int64_t> ls = lengths(in, o.bucket_size, o.cp);
  ChunkedDocs chunked = chunked_times(in);
  tail(in, c, &o, &chunked);
  if (pool_options(in, c, o)) fuzz_pool(ls, c, o, twice);
  if (const uint8_t la = in.u8()) fuzz_lookahead(in, la, ls, c, o, chunked, twice);
  std::string reject = check::schedule_rejection(ls, c, o);
  if (reject.empty()) reject = check::chunked_rejection(chunked.us, chunked.chunks);
#ifdef SKRULL_FUZZ_REPLAY
  if (std::getenv("SKRULL_FUZZ_VERBOSE"))
    std::fprintf(stderr,
                 "schedule n=%zu dp=%d cp=%d bucket=%lld refine=%d mbc=%d slot_gds=%d timeline=%d whole=%d "
                 "chunked=%zu reject=%s\n",
                 ls.size(), o.dp, o.cp, static_cast<long long>(o.bucket_size), int(o.refine),
                 int(o.micro_batch_count), int(o.slot_gds), int(o.timeline), int(c.whole_buffer), chunked.size(),
                 reject.c_str());
#endif
  Schedule s;
  try {
    s = schedule(ls, c, o, chunked);
  } catch (const std::invalid_argument& ex) {
    if (reject.empty()) die(std::string("refused an acceptable input: ") + ex.what());
    if (std::strlen(ex.what()) < 10) die("invalid_argument without a message");
    return;
  }
  if (!reject.empty()) die("accepted an input outside the ranges: " + reject);
  const std::string err = check::schedule_error(ls, c, o, s);
  if (!err.empty()) die("bad plan: " + err);
  // Each chunked document on one DP rank in range, in that rank's time and the step's.
  if (s.chunked_us != chunked.us || s.chunked_chunks != chunked.chunks || s.chunked_dp_rank.size() != chunked.size())
    die("chunked documents not kept");
  std::vector<double> load(o.dp, 0.0);
  for (size_t k = 0; k < chunked.size(); ++k) {
    if (s.chunked_dp_rank[k] < 0 || s.chunked_dp_rank[k] >= o.dp) die("chunked document on no DP rank");
    load[s.chunked_dp_rank[k]] += chunked.us[k];
  }
  for (int32_t i = 0; i < o.dp; ++i)
    if (!(s.dp_time_us[i] >= load[i] * (1 - 1e-12)) || !(s.makespan_us >= load[i] * (1 - 1e-12)))
      die("a DP rank's time or the step below its chunked documents");
  // Lockstep pad chunks (chunked.hpp): never negative, and every rank runs as many passes.
  const std::vector<int32_t> pads = lockstep_pads(s.chunked_chunks, s.chunked_dp_rank, o.dp);
  std::vector<int64_t> passes(o.dp, 0);
  for (int32_t i = 0; i < o.dp; ++i) passes[i] = pads[i];
  for (size_t k = 0; k < chunked.size(); ++k) passes[s.chunked_dp_rank[k]] += chunked.chunks[k];
  for (int32_t i = 0; i < o.dp; ++i)
    if (pads[i] < 0 || passes[i] != passes[0]) die("pad chunks negative or ranks running different passes");
  CostModel per_doc = c;
  per_doc.whole_buffer = false;
  for (const MicroBatch& mb : s.micro_batches) {
    std::vector<int64_t> group;
    for (int32_t k : mb.seqs) group.push_back(s.lengths[k]);
    const double bound = c.micro_batch_lower_bound_us(group, o.cp);
    if (!(mb.dacp.time_us >= bound * (1 - 1e-9))) die("a micro-batch beats the lower bound");
    // The plan's price is its placement's price under the model it was priced with (after a
    // hedge's re-pricing too), bit for bit.
    const DacpResult again = evaluate_placement(group, mb.dacp.cp_rank, c, o.cp, o.bucket_size);
    if (again.status != Status::kOk || again.time_us != mb.dacp.time_us || again.rank_tokens != mb.dacp.rank_tokens ||
        again.rank_flops != mb.dacp.rank_flops || again.comm_bytes != mb.dacp.comm_bytes)
      die("a micro-batch's price is not its placement's");
    // A buffer computed whole costs at least its documents computed one by one.
    if (c.whole_buffer &&
        !(evaluate_placement(group, mb.dacp.cp_rank, per_doc, o.cp, o.bucket_size).time_us <=
          mb.dacp.time_us * (1 + 1e-12)))
      die("whole_buffer prices a placement below per document");
  }
  // The plan the trainer runs (to_plan) has the schedule's step time.
  if (to_plan(s, o.cp, o.timeline, c.pad_pass_us(), c.step_fixed_us).makespan_us != s.makespan_us)
    die("the schedule as a Plan has another step time");
  if (twice && (digest(schedule(ls, c, o, chunked)) != digest(s) ||
                schedule(ls, c, o, chunked).chunked_dp_rank != s.chunked_dp_rank))
    die("same input, different plan");
}

void fuzz_dacp(Bytes& in) {
  const int32_t cp = rank_count(in);
  const int64_t bucket = bucket_size(in);
  const uint8_t e = in.u8();
  const auto placement = enum_value<Placement>(e % 4, 1);
  const auto rollback = enum_value<Rollback>((e / 4) % 4, 1);
  const bool refine = e & 0x80;
  // 0: dacp, 1: dacp_for (Algorithm 1 and/or the shard sweep), 2: dacp_sweep.
  const int entry = (e & 0x40) ? 1 : ((e & 0x20) ? 2 : 0);
  Options o;
  o.cp = cp;
  o.bucket_size = bucket;
  o.placement = entry == 2 ? Placement::kLeastLoad : placement;
  o.rollback = entry == 2 ? Rollback::kLongest : rollback;
  o.refine = refine;
  if (entry == 1) search_options(in, o);
  CostModel c = cost_model(in);
  const std::vector<int64_t> ls = lengths(in, bucket, cp);
  tail(in, c);
  o.overlength = Overlength::kDrop;  // dacp has no over-length rule
  const std::string reject = check::schedule_rejection(ls, c, o);
  DacpResult r;
  try {
    r = entry == 0 ? dacp(ls, c, cp, bucket, placement, rollback, refine)
                   : (entry == 1 ? dacp_for(ls, c, o) : dacp_sweep(ls, c, cp, bucket));
  } catch (const std::invalid_argument& ex) {
    if (reject.empty()) die(std::string("dacp refused an acceptable input: ") + ex.what());
    return;
  }
  if (!reject.empty()) die("dacp accepted an input outside the ranges: " + reject);
  const std::string err = check::dacp_error(ls, cp, bucket, r);
  if (!err.empty()) die("bad dacp answer: " + err);
  const DacpResult again = evaluate_placement(ls, r.cp_rank, c, cp, bucket);
  if (again.rank_tokens != r.rank_tokens || again.time_us != r.time_us || again.comm_bytes != r.comm_bytes)
    die("evaluate_placement disagrees with dacp");
  if ((r.status == Status::kOk) && again.status != Status::kOk) die("dacp OK but evaluate_placement overfull");
  if (r.status == Status::kOk && !(r.time_us >= c.micro_batch_lower_bound_us(ls, cp) * (1 - 1e-9)))
    die("dacp beats the lower bound");
  // The host floor is once a layer call (cost_model.hpp layer_us): a placement's price lies between
  // its price with no floor and that plus one floor a layer, and a micro-batch with a sequence pays
  // at least the floor a layer and its fixed cost (floored_us).
  if (r.status == Status::kOk && !ls.empty()) {
    CostModel bare = c;
    bare.host_floor_us = 0.0;
    const double line = evaluate_placement(ls, r.cp_rank, bare, cp, bucket).time_us;
    if (!(r.time_us >= line * (1 - 1e-12)) || !(r.time_us <= (line + c.shape.layers * c.host_floor_us) * (1 + 1e-12)))
      die("the host floor charged other than once a layer call");
    if (!(r.time_us >= c.floored_us(1.0) * (1 - 1e-12))) die("a micro-batch below one floor a layer");
  }
}

// evaluate_placement on a placement read from the input (any values, any
// size): refused iff a value is out of range, else its figures recomputed.
void fuzz_evaluate(Bytes& in) {
  const int32_t cp = rank_count(in);
  const int64_t bucket = bucket_size(in);
  CostModel c = cost_model(in);
  const std::vector<int64_t> ls = lengths(in, bucket, cp);
  if (ls.size() > 100000) return;
  const int32_t width = std::min<int32_t>(std::max<int32_t>(cp, 1), kMaxRanks);
  std::vector<int32_t> placement;
  for (size_t i = 0; i < ls.size(); ++i) {
    const uint8_t b = in.u8();
    const int32_t special[] = {width, -2, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    placement.push_back(b < 250 ? static_cast<int32_t>(b % (width + 1)) - 1 : special[b % 4]);
  }
  if (in.u8() == 7 && !placement.empty()) placement.pop_back();
  tail(in, c);
  Options o;
  o.cp = cp;
  o.bucket_size = bucket;
  o.overlength = Overlength::kDrop;
  std::string reject = check::schedule_rejection(ls, c, o);
  if (reject.empty() && placement.size() != ls.size()) reject = "placement size";
  for (int32_t p : placement)
    if (reject.empty() && p != kDistributed && (p < 0 || p >= cp)) reject = "placement value";
  DacpResult r;
  try {
    r = evaluate_placement(ls, placement, c, cp, bucket);
  } catch (const std::invalid_argument& ex) {
    if (reject.empty()) die(std::string("evaluate_placement refused an acceptable input: ") + ex.what());
    return;
  }
  if (!reject.empty()) die("evaluate_placement accepted " + reject);
  if (r.rank_tokens != check::rank_tokens(ls, placement, cp)) die("evaluate_placement tokens");
  bool fits = true;
  for (int64_t t : r.rank_tokens) fits = fits && t <= bucket;
  if (fits != (r.status == Status::kOk)) die("evaluate_placement status");
  if (!std::isfinite(r.time_us) || r.time_us < 0) die("evaluate_placement time");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint8_t mode = in.u8();
  if ((mode & 3) == 3)
    fuzz_evaluate(in);
  else if (mode & 1)
    fuzz_dacp(in);
  else
    fuzz_schedule(in, mode & 2);
  return 0;
}

#ifdef SKRULL_FUZZ_REPLAY
// Runs each file named on the command line once (the corpus, in ctest).
int main(int argc, char** argv) {
  int runs = 0;
  for (int i = 1; i < argc; ++i) {
    std::FILE* f = std::fopen(argv[i], "rb");
    if (!f) {
      std::fprintf(stderr, "cannot open %s\n", argv[i]);
      return 2;
    }
    std::vector<uint8_t> buf;
    uint8_t chunk[4096];
    for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, f)) > 0;) buf.insert(buf.end(), chunk, chunk + got);
    std::fclose(f);
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
    ++runs;
  }
  std::printf("fuzz_replay: %d inputs, all sound\n", runs);
  return 0;
}
#endif
