// Look-ahead (docs/design/lookahead.md): regroup the samples of a window of
// W global batches over the window's W steps so that the window's predicted
// time is least, before each step is planned on its own.
//
// A block window: W consecutive steps (which ones: skrull_ext/data/windows.py),
// and every sample that arrived in one of them is trained at one of them, so
// no sample is trained more than W-1 steps from the step it arrived in
// (earlier or later). Step s
// of the window keeps the number of samples that arrived in it (its
// sequence count). Which samples share a step is the only decision; the
// per-step planner (GDS + DACP, or the pool) still plans each step's set,
// with its memory and over-length rules.
//
// Choosing the grouping costs full step plans, and a full plan of a step of
// 8,192 samples takes milliseconds; so candidates are screened by an O(1)
// estimate of a step's time (step_estimate.hpp) and only a few are planned
// in full (docs/design/lookahead.md, "Choosing the grouping"):
//   1. candidates: arrival order (what W = 1 trains); long-first: for a
//      fraction f of the window's samples, the longest f*n (length
//      descending, ties by arrival) split by FLOPs over k steps with GDS's LPT
//      (split_over_dp), k = 1..8 then a ladder of two k a doubling (12, 16,
//      24, ...) and W (kLookaheadEveryK: O(log W) candidates, every k at the
//      shipped widths), the rest filling each step's remaining count in
//      arrival order; the whole window sorted by length (LongAlign's sort,
//      within a window);
//   2. screening: every candidate other than arrival order is estimated (the
//      sum of its steps' estimates); they are planned in full in that order
//      (ties to the most long samples a step, then candidate order), the
//      first always, the next while their steps fit
//      in the budget kLookaheadPlanWork (sequences planned; a step identical
//      to arrival order's keeps its price);
//   3. the least summed full price wins, ties to the earlier priced: arrival
//      order first, so the window is never predicted slower than W = 1;
//   4. a swap search on the winner: two samples of different lengths in two
//      steps trade places (first improvement, steps and members in order)
//      where the two steps' estimates rise by at most kLookaheadScreenSlack
//      (O(log n) a trial, at most kLookaheadScreenWork trials, looking at
//      at most kLookaheadSwapVisits pairs) and then the two steps' full
//      plans fall (each planned while kLookaheadPlanWork lasts), until a pass
//      finds none; only where that budget can check kLookaheadMinSwaps swaps.
// Chunked documents (overlength "chunk", chunked.hpp) stay at the step they
// arrived in; each step's are priced with it (the estimate's chunked terms,
// and the full planner is given them), so the regrouping moves the other
// samples around them: free-running, a step holding a long chunked document
// gets short samples. On a lockstep timeline they run after every rank's
// slots, with the pad chunks that keep the ranks' passes paired (chunked.hpp):
// a term of its own in the estimate, the same for every grouping of a step.
// Every price in the answer is the full planner's. The budgets count
// operations, never seconds, so the answer is a pure function of (batches,
// cost model, options, step planner).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "skrull/chunked.hpp"
#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/gds.hpp"
#include "skrull/step_estimate.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"

namespace skrull {

constexpr int32_t kMaxLookahead = 1024;  // global batches in one window

// Sequences the full step planner may plan per window beyond arrival order
// and the best-screened candidate (planned whatever their size): more
// finalists, then the swap search's checks. At 8 steps of 8,192 samples it
// holds no second finalist (one plans up to 65,536), at 8 steps of 4,096
// one, at 8 steps of 256 sixteen; at 8 steps of 8 samples every candidate
// and about 2,000 swap checks.
constexpr int64_t kLookaheadPlanWork = int64_t{1} << 15;

// Swaps the swap search may screen by the estimate per window.
constexpr int64_t kLookaheadScreenWork = int64_t{1} << 16;

// A swap is planned unless the estimate of its two steps rises by more than
// this fraction.
constexpr double kLookaheadScreenSlack = 0.01;

// The swap search runs only where the plan budget left can check this many
// swaps of two average steps: a handful of checks among millions of pairs
// finds nothing in expectation (8 steps of 8,192 samples), while the small
// windows where swaps pay (8 samples a step) get thousands.
constexpr int64_t kLookaheadMinSwaps = 64;

// Estimates closer than this fraction of the least one rank as ties.
constexpr double kLookaheadTie = 1e-6;

// Fractions of a window's samples the long-first candidates move.
constexpr double kLookaheadFractions[] = {0.02, 0.05, 0.1, 0.2, 0.35};

// The long-first candidates split over every k = 1..kLookaheadEveryK steps
// (every k of the shipped widths: "auto" chooses 2, 4 or 8), then over a
// ladder of two k a doubling (12, 16, 24, 32, 48, ...) and W itself: a
// window of W steps screens O(log W) of them a fraction, not W, each an
// O(n) construction and estimate (every k made 5,120 candidates of 8
// million samples each at W = 1024 and 8,192 samples a step).
constexpr int32_t kLookaheadEveryK = 8;

// Pairs the swap search may look at per window (pairs of steps, and pairs of
// samples, those of equal lengths included, which cost no trial): its step
// pairs are W^2/2 a pass and its sample pairs up to n^2/2, which the trial
// budget alone does not bound where lengths repeat.
constexpr int64_t kLookaheadSwapVisits = int64_t{1} << 24;

// The window's regrouping. Samples are numbered flat, in arrival order:
// batch 0's samples, then batch 1's, ... (sample i of batch b is
// offsets[b] + i).
struct Lookahead {
  std::vector<int32_t> offsets;             // W + 1: batch b's samples are [offsets[b], offsets[b+1])
  std::vector<int32_t> step;                // per sample: the window step it is trained at (the one map)
  std::vector<double> step_us;              // predicted time of each step as regrouped (full plan)
  std::vector<double> arrival_us;           // predicted time of each step in arrival order (full plan)
  double window_us = 0.0;                   // sum of step_us
  double arrival_window_us = 0.0;           // sum of arrival_us
  int32_t moved = 0;                        // samples trained at another step than they arrived in
  int32_t max_delay = 0;                    // largest |step - arrival step|, <= W - 1
  double long_fraction = 0.0;               // chosen candidate: 0 arrival order, 1 the full sort
  int32_t long_steps = 0;                   // steps the long samples were split over (W for the sort)
  int32_t candidates = 0;                   // groupings priced by full step plans (arrival order included)
  int32_t screened = 0;                     // groupings estimated (arrival order not included)
  int32_t swaps = 0;                        // swaps the swap search kept
  int64_t swap_trials = 0;                  // swaps it screened by the estimate
  int64_t swap_visits = 0;                  // pairs of steps and of samples it looked at
  int64_t planned = 0;                      // sequences planned in full (the budgets' unit)
  double elapsed_us = 0.0;                  // wall time of the call

  // Per step: its samples, ascending (arrival order), derived from `step`.
  std::vector<std::vector<int32_t>> steps() const;
};

namespace detail {

// The k the long-first candidates of a window of w steps are split over,
// ascending: 1..min(w, kLookaheadEveryK), then 12, 16, 24, 32, ... below w,
// then w.
inline std::vector<int32_t> screened_steps(int32_t w) {
  std::vector<int32_t> ks;
  for (int32_t k = 1; k <= std::min(w, kLookaheadEveryK); ++k) ks.push_back(k);
  for (int32_t p = kLookaheadEveryK; p < w; p *= 2) {
    if (p + p / 2 < w) ks.push_back(p + p / 2);
    if (2 * p < w) ks.push_back(2 * p);
  }
  if (w > kLookaheadEveryK) ks.push_back(w);
  return ks;
}

// Steps of a grouping given as each sample's step: members ascending.
inline std::vector<std::vector<int32_t>> members_of(const std::vector<int32_t>& step, int32_t w) {
  std::vector<std::vector<int32_t>> out(w);
  for (int32_t k = 0; k < static_cast<int32_t>(step.size()); ++k) out[step[k]].push_back(k);
  return out;
}

}  // namespace detail

inline std::vector<std::vector<int32_t>> Lookahead::steps() const {
  return detail::members_of(step, static_cast<int32_t>(offsets.size()) - 1);
}

namespace detail {

// Long-first candidate: the first m of `order` (the samples, length
// descending, ties by index, as split_over_dp orders them) split over steps
// 0..k-1 by LPT on FLOPs (each to the step with the least FLOPs so far, ties
// to the lower step: GDS's split_over_dp, here without its sort), then every
// other sample fills the steps' remaining counts in arrival order. False when
// a step's share exceeds its count.
inline bool long_first(const std::vector<double>& flops, const std::vector<int32_t>& order, int32_t m,
                       const std::vector<int32_t>& counts, int32_t k, std::vector<int32_t>& step) {
  const int32_t w = static_cast<int32_t>(counts.size());
  step.assign(flops.size(), -1);
  std::vector<int32_t> room = counts;
  if (k <= 32) {
    std::vector<double> load(k, 0.0);
    for (int32_t i = 0; i < m; ++i) {
      const int32_t q = order[i], t = argmin(load);
      if (room[t] == 0) return false;
      --room[t];
      step[q] = t;
      load[t] += flops[q];
    }
  } else {
    using Entry = std::pair<double, int32_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (int32_t t = 0; t < k; ++t) heap.emplace(0.0, t);
    for (int32_t i = 0; i < m; ++i) {
      const int32_t q = order[i];
      auto [load, t] = heap.top();
      heap.pop();
      if (room[t] == 0) return false;
      --room[t];
      step[q] = t;
      heap.emplace(load + flops[q], t);
    }
  }
  int32_t s = 0;
  for (int32_t q = 0; q < static_cast<int32_t>(flops.size()); ++q) {
    if (step[q] >= 0) continue;
    while (s < w && room[s] == 0) ++s;
    step[q] = s;  // counts sum to the sample count: a step has room
    --room[s];
  }
  return true;
}

// The whole window sorted, longest first (`order`), cut into the steps' counts.
inline void sorted_cut(const std::vector<int32_t>& order, const std::vector<int32_t>& counts,
                       std::vector<int32_t>& step) {
  step.assign(order.size(), 0);
  int32_t s = 0, used = 0;
  for (int32_t q : order) {
    while (used == counts[s]) ++s, used = 0;
    step[q] = s;
    ++used;
  }
}

// The window's samples as the estimate sees them: each sample's cost, the
// samples by length descending (ties by arrival), the estimator, and each
// step's chunked documents.
struct Screen {
  const StepEstimator& est;
  const std::vector<int64_t>& lengths;
  const std::vector<double>& cost;     // per sample: est.cost(flops)
  const std::vector<int32_t>& order;   // samples, length descending, ties by index
  const std::vector<ChunkedDocs>& chunked;  // per step: its chunked documents
  std::vector<double> cost_desc;       // cost[order[i]]: read in order, not gathered
  std::vector<int64_t> length_desc;    // lengths[order[i]]
  std::vector<StepSketch> seed;        // per step: the sketch of its chunked documents alone

  Screen(const StepEstimator& e, const std::vector<int64_t>& l, const std::vector<double>& c,
         const std::vector<int32_t>& o, const std::vector<ChunkedDocs>& ch)
      : est(e), lengths(l), cost(c), order(o), chunked(ch), seed(ch.size()) {
    for (int32_t q : order) {
      cost_desc.push_back(cost[q]);
      length_desc.push_back(lengths[q]);
    }
    for (size_t t = 0; t < ch.size(); ++t)
      for (size_t k = 0; k < ch[t].size(); ++k) StepEstimator::add_chunked(seed[t], ch[t].us[k], ch[t].chunks[k]);
  }

  // Each step's sketch under a grouping (each sample's step).
  std::vector<StepSketch> sketches(const std::vector<int32_t>& step, int32_t w) const {
    std::vector<StepSketch> out = seed;
    out.resize(w);
    for (size_t i = 0; i < order.size(); ++i) est.add_descending(out[step[order[i]]], cost_desc[i], length_desc[i]);
    return out;
  }
  // The grouping's estimate: its steps' estimates summed in step order.
  double total(const std::vector<int32_t>& step, int32_t w) const {
    double sum = 0.0;
    for (const StepSketch& s : sketches(step, w)) sum += est.us(s);
    return sum;
  }
};

// The k-th largest (0-based) of the multiset `desc` (descending) with the
// element at position `out` replaced by `x`; O(log n).
inline double kth_after_swap(const std::vector<double>& desc, size_t k, size_t out, double x) {
  if (k >= desc.size()) return 0.0;
  const size_t above = static_cast<size_t>(
      std::lower_bound(desc.begin(), desc.end(), x, std::greater<double>()) - desc.begin());  // elements > x
  const size_t p = above - (out < above ? 1 : 0);  // x's position among the rest
  const auto rest = [&](size_t i) { return desc[i < out ? i : i + 1]; };
  if (k < p) return rest(k);
  if (k == p) return x;
  return rest(k - 1);
}

// The swap search on `out`'s grouping (see the header comment); `plan_left`
// is the full planner's remaining budget in sequences.
template <class StepTime>
void swap_search(const Screen& screen, StepTime& step_time, int64_t plan_left, Lookahead& out) {
  const int32_t w = static_cast<int32_t>(out.step_us.size());
  std::vector<std::vector<int32_t>> members = out.steps();  // the search's own view, kept in step with out.step
  const int64_t two_steps = 2 * static_cast<int64_t>(screen.order.size()) / w;
  if (plan_left < kLookaheadMinSwaps * two_steps) return;
  const int32_t groups = screen.est.groups();
  const auto& lengths = screen.lengths;
  const auto& cost = screen.cost;
  // Per step: its samples' costs descending, and where each sample's cost sits.
  std::vector<std::vector<double>> desc(w);
  std::vector<size_t> pos(lengths.size());
  for (int32_t q : screen.order) {
    pos[q] = desc[out.step[q]].size();
    desc[out.step[q]].push_back(cost[q]);
  }
  std::vector<StepSketch> sketch = screen.sketches(out.step, w);
  std::vector<double> est(w);
  for (int32_t s = 0; s < w; ++s) est[s] = screen.est.us(sketch[s]);
  // Step s's sketch with sample `gone` replaced by sample `come`.
  const auto swapped = [&](int32_t s, int32_t gone, int32_t come) {
    StepSketch t = sketch[s];
    t.work += cost[come] - cost[gone];
    t.tokens += static_cast<double>(lengths[come] - lengths[gone]);
    t.c1 = kth_after_swap(desc[s], 0, pos[gone], cost[come]);
    t.cp_ = kth_after_swap(desc[s], static_cast<size_t>(groups - 1), pos[gone], cost[come]);
    t.cp1 = kth_after_swap(desc[s], static_cast<size_t>(groups), pos[gone], cost[come]);
    return t;
  };
  // Step s's costs, positions and sketch rebuilt from its members.
  std::vector<int32_t> by_cost;
  const auto rebuild = [&](int32_t s) {
    by_cost = members[s];
    std::stable_sort(by_cost.begin(), by_cost.end(), [&](int32_t a, int32_t b) { return lengths[a] > lengths[b]; });
    desc[s].clear();
    sketch[s] = screen.seed[s];
    for (int32_t q : by_cost) {
      pos[q] = desc[s].size();
      desc[s].push_back(cost[q]);
      screen.est.add_descending(sketch[s], cost[q], lengths[q]);
    }
    est[s] = screen.est.us(sketch[s]);
  };
  std::vector<int32_t> a, b;
  std::vector<int64_t> la, lb;
  const auto lengths_of = [&](const std::vector<int32_t>& members, std::vector<int64_t>& l) {
    l.clear();
    for (int32_t q : members) l.push_back(lengths[q]);
  };
  bool budget = true;  // false once a budget is spent: no swap can be kept any more
  const auto visit = [&] {
    if (out.swap_visits >= kLookaheadSwapVisits) return budget = false;
    ++out.swap_visits;
    return true;
  };
  for (bool improved = true; improved && budget;) {
    improved = false;
    for (int32_t s1 = 0; s1 < w && budget; ++s1)
      for (int32_t s2 = s1 + 1; s2 < w && budget; ++s2) {
        if (!visit() || members[s2].empty()) continue;
        for (size_t i = 0; i < members[s1].size() && budget; ++i)
          for (size_t j = 0; j < members[s2].size(); ++j) {
            if (!visit()) break;
            const int32_t q1 = members[s1][i], q2 = members[s2][j];
            if (lengths[q1] == lengths[q2]) continue;
            if (out.swap_trials >= kLookaheadScreenWork) {
              budget = false;
              break;
            }
            ++out.swap_trials;
            const double e1 = screen.est.us(swapped(s1, q1, q2)), e2 = screen.est.us(swapped(s2, q2, q1));
            if (e1 + e2 > (est[s1] + est[s2]) * (1.0 + kLookaheadScreenSlack)) continue;  // the estimate says worse: not planned
            const int64_t size = static_cast<int64_t>(members[s1].size() + members[s2].size());
            if (size > plan_left) {
              budget = false;
              break;
            }
            a = members[s1];
            b = members[s2];
            a[i] = q2;
            b[j] = q1;
            std::sort(a.begin(), a.end());  // a step's samples stay in arrival order
            std::sort(b.begin(), b.end());
            lengths_of(a, la);
            lengths_of(b, lb);
            plan_left -= size;
            out.planned += size;
            const double ta = static_cast<double>(step_time(la, screen.chunked[s1]));
            const double tb = static_cast<double>(step_time(lb, screen.chunked[s2]));
            if (!(ta + tb < (out.step_us[s1] + out.step_us[s2]) * (1.0 - 1e-12))) continue;
            members[s1].swap(a);
            members[s2].swap(b);
            out.step[q1] = s2;
            out.step[q2] = s1;
            out.step_us[s1] = ta;
            out.step_us[s2] = tb;
            rebuild(s1);
            rebuild(s2);
            ++out.swaps;
            improved = true;
            i = members[s1].size();  // step s1 changed: on to the next pair of steps
            break;
          }
      }
  }
  out.window_us = 0.0;
  for (double t : out.step_us) out.window_us += t;
}

}  // namespace detail

// Regroups the window `batches` (each a global batch's lengths, in arrival
// order; W = batches.size()) over its W steps. `chunked` (W entries, or empty
// for none): each batch's chunked documents (times and chunk passes), which
// stay at their step.
// `step_time(lengths, chunked)` returns the predicted time of one step
// planned on those lengths with those chunked documents (the caller's
// policy and timeline, on `opt`'s DP x CP and BucketSize, which the
// estimate reads). W = 1, or no candidate predicted faster, returns arrival
// order. Throws std::invalid_argument for W outside [1, kMaxLookahead], more
// than kMaxSequences samples, a bad length, chunked time or chunk count, or
// `chunked` not of W entries.
template <class StepTime>
Lookahead lookahead(const std::vector<std::vector<int64_t>>& batches, std::vector<ChunkedDocs> chunked,
                    const CostModel& cost, const Options& opt, StepTime&& step_time) {
  const auto start = std::chrono::steady_clock::now();
  const int32_t w = static_cast<int32_t>(batches.size());
  if (batches.empty() || batches.size() > static_cast<size_t>(kMaxLookahead))
    throw std::invalid_argument("lookahead window must hold 1 to " + std::to_string(kMaxLookahead) +
                                " global batches, got " + std::to_string(batches.size()));
  if (chunked.empty()) chunked.resize(w);
  if (chunked.size() != batches.size())
    throw std::invalid_argument("lookahead window: " + std::to_string(chunked.size()) +
                                " lists of chunked documents for " + std::to_string(w) + " global batches");
  for (const auto& c : chunked) validate_chunked(c);
  cost.validate();
  Lookahead out;
  std::vector<int64_t> lengths;
  std::vector<int32_t> counts(w), arrival;
  out.offsets.push_back(0);
  for (int32_t b = 0; b < w; ++b) {
    try {
      validate_lengths(batches[b], "global batch");
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("lookahead window, global batch " + std::to_string(b) + ": " + e.what());
    }
    if (lengths.size() + batches[b].size() > static_cast<size_t>(kMaxSequences))
      throw std::invalid_argument("lookahead window holds more than " + std::to_string(kMaxSequences) + " sequences");
    lengths.insert(lengths.end(), batches[b].begin(), batches[b].end());
    counts[b] = static_cast<int32_t>(batches[b].size());
    arrival.insert(arrival.end(), batches[b].size(), b);
    out.offsets.push_back(static_cast<int32_t>(lengths.size()));
  }
  const int32_t n = static_cast<int32_t>(lengths.size());

  const std::vector<std::vector<int32_t>> arrival_members = detail::members_of(arrival, w);
  std::vector<int64_t> step_lengths;
  // Prices a grouping by full step plans: each step's predicted time, summed
  // in step order. A step whose members equal arrival order's keeps its price.
  const auto price = [&](const std::vector<std::vector<int32_t>>& members, std::vector<double>& t) {
    double total = 0.0;
    for (int32_t s = 0; s < w; ++s) {
      if (!out.arrival_us.empty() && members[s] == arrival_members[s]) {
        t[s] = out.arrival_us[s];
      } else {
        step_lengths.clear();
        for (int32_t q : members[s]) step_lengths.push_back(lengths[q]);
        t[s] = step_lengths.empty() && chunked[s].empty() ? 0.0
                                                          : static_cast<double>(step_time(step_lengths, chunked[s]));
        out.planned += static_cast<int64_t>(step_lengths.size());
      }
      total += t[s];
    }
    ++out.candidates;
    return total;
  };

  out.step = arrival;
  std::vector<double> times(w);
  out.arrival_window_us = price(arrival_members, times);
  out.arrival_us = times;
  out.step_us = out.arrival_us;
  out.window_us = out.arrival_window_us;

  if (w > 1 && n > 1) {
    std::vector<double> flops, sample_cost(n);
    detail::sequence_flops(lengths.data(), lengths.size(), cost, flops);
    const StepEstimator estimator(cost, opt);
    for (int32_t q = 0; q < n; ++q) sample_cost[q] = estimator.cost(flops[q]);
    std::vector<int32_t> order(n), scratch, step;
    std::iota(order.begin(), order.end(), 0);
    detail::sort_descending_by_length(lengths, order, scratch);
    const detail::Screen screen(estimator, lengths, sample_cost, order, chunked);

    // A candidate is kept as what rebuilds it (its fraction and k: the
    // rebuild is deterministic), not as its map: a window of 1,024 steps of
    // 8,192 samples would otherwise hold thousands of maps of 8 million.
    struct Candidate {
      double fraction;  // 1 for the sort
      int32_t m;        // long samples (the sort: n)
      int32_t k;
      double estimate;
    };
    std::vector<Candidate> found;
    const auto build = [&](const Candidate& c, std::vector<int32_t>& s) {
      if (c.fraction == 1.0) {
        detail::sorted_cut(order, counts, s);
        return true;
      }
      return detail::long_first(flops, order, c.m, counts, c.k, s);
    };
    const auto screened = [&](const Candidate& c) {
      if (!build(c, step) || step == arrival) return;  // arrival order is priced already
      found.push_back(c);
      found.back().estimate = screen.total(step, w);
      ++out.screened;
    };
    int32_t last_m = 0;
    for (double f : kLookaheadFractions) {
      const int32_t m = std::max<int32_t>(1, static_cast<int32_t>(f * n + 0.5));
      if (m == last_m || m >= n) continue;
      last_m = m;
      for (int32_t k : detail::screened_steps(w)) screened({f, m, k, 0.0});
    }
    screened({1.0, n, w, 0.0});  // the whole window sorted, longest first, cut into the steps' counts

    // Finalists in estimate order: the first always, the next while their
    // new steps fit in the budget. The estimate is a bound, and where no
    // straggler term is active it is the same for many candidates (their
    // work summed over the groups); such ties (within kLookaheadTie of the
    // best estimate) go to the candidate with the most long samples a step
    // (fraction / steps: the full plans of measured windows fall with it,
    // since long samples sharing a step leave the other steps short ones to
    // pack), then to candidate order.
    double least = found.empty() ? 0.0 : found[0].estimate;
    for (const Candidate& c : found) least = std::min(least, c.estimate);
    const double quantum = least * kLookaheadTie;
    std::vector<int64_t> level(found.size());
    for (size_t i = 0; i < found.size(); ++i)
      level[i] = quantum > 0.0 ? static_cast<int64_t>(std::floor(found[i].estimate / quantum)) : 0;
    std::vector<int32_t> rank(found.size());
    std::iota(rank.begin(), rank.end(), 0);
    std::stable_sort(rank.begin(), rank.end(), [&](int32_t x, int32_t y) {
      if (level[x] != level[y]) return level[x] < level[y];
      return found[x].fraction / found[x].k > found[y].fraction / found[y].k;
    });
    int64_t plan_left = kLookaheadPlanWork;
    for (size_t r = 0; r < rank.size(); ++r) {
      const Candidate& c = found[rank[r]];
      build(c, step);
      auto members = detail::members_of(step, w);
      int64_t size = 0;
      for (int32_t t = 0; t < w; ++t)
        if (members[t] != arrival_members[t]) size += static_cast<int64_t>(members[t].size());
      if (r > 0) {
        if (size > plan_left) break;
        plan_left -= size;
      }
      const double total = price(members, times);
      if (total < out.window_us) {
        out.window_us = total;
        out.step_us = times;
        out.step = step;
        out.long_fraction = c.fraction;
        out.long_steps = c.k;
      }
    }
    detail::swap_search(screen, step_time, plan_left, out);
  }
  for (int32_t q = 0; q < n; ++q) {
    const int32_t d = std::abs(out.step[q] - arrival[q]);
    out.moved += d != 0;
    out.max_delay = std::max(out.max_delay, d);
  }
  out.elapsed_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return out;
}

// The window with no chunked documents: `step_time(lengths)`.
template <class StepTime>
Lookahead lookahead(const std::vector<std::vector<int64_t>>& batches, const CostModel& cost, const Options& opt,
                    StepTime&& step_time) {
  return lookahead(batches, {}, cost, opt,
                   [&](const std::vector<int64_t>& l, const ChunkedDocs&) { return step_time(l); });
}

}  // namespace skrull
