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
// Candidates, each priced as the sum of its steps' predicted times by the
// caller's step planner (`step_time`, e.g. schedule(...).makespan_us):
//   0. arrival order (what W = 1 trains): never beaten by a worse choice;
//   1. for a fraction f of the window's samples, the longest f*n (length
//      descending, ties by arrival) split by FLOPs over k steps with GDS's
//      LPT (split_over_dp), k = 1..W, the rest filling each step's remaining
//      count in arrival order: gives every DP rank comparable long work in
//      the same step instead of one straggler in each;
//   2. the whole window sorted by length (LongAlign's sort, within a window).
// The least summed time wins, ties to the lower candidate. Then a swap
// search: two samples of different lengths in two steps trade places where
// that lowers the two steps' summed time (first improvement, steps and
// members in order), until a pass finds none or kLookaheadSwapWork
// sequences have been planned. The answer is a pure function of (batches,
// cost model, step planner).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/gds.hpp"
#include "skrull/types.hpp"
#include "skrull/validate.hpp"

namespace skrull {

constexpr int32_t kMaxLookahead = 1024;  // global batches in one window

// Sequences the swap search may plan per window (its work budget): a few
// passes over every pair of an 8-step window of 8-sample steps, a few
// hundred swaps of a window of 256-sample steps.
constexpr int64_t kLookaheadSwapWork = int64_t{1} << 18;

// Fractions of a window's samples the long-first candidates move.
constexpr double kLookaheadFractions[] = {0.02, 0.05, 0.1, 0.2, 0.35};

// The window's regrouping. Samples are numbered flat, in arrival order:
// batch 0's samples, then batch 1's, ... (sample i of batch b is
// offsets[b] + i).
struct Lookahead {
  std::vector<int32_t> offsets;             // W + 1: batch b's samples are [offsets[b], offsets[b+1])
  std::vector<int32_t> step;                // per sample: the window step it is trained at
  std::vector<std::vector<int32_t>> steps;  // per step: its samples, ascending (arrival order)
  std::vector<double> step_us;              // predicted time of each step as regrouped
  std::vector<double> arrival_us;           // predicted time of each step in arrival order
  double window_us = 0.0;                   // sum of step_us
  double arrival_window_us = 0.0;           // sum of arrival_us
  int32_t moved = 0;                        // samples trained at another step than they arrived in
  int32_t max_delay = 0;                    // largest |step - arrival step|, <= W - 1
  double long_fraction = 0.0;               // chosen candidate: 0 arrival order, 1 the full sort
  int32_t long_steps = 0;                   // steps the long samples were split over (W for the sort)
  int32_t candidates = 0;                   // groupings priced
  int32_t swaps = 0;                        // swaps the swap search kept
  double elapsed_us = 0.0;                  // wall time of the call
};

namespace detail {

// Steps of a grouping given as each sample's step: members ascending.
inline std::vector<std::vector<int32_t>> members_of(const std::vector<int32_t>& step, int32_t w) {
  std::vector<std::vector<int32_t>> out(w);
  for (int32_t k = 0; k < static_cast<int32_t>(step.size()); ++k) out[step[k]].push_back(k);
  return out;
}

// Long-first candidate: `longest` (descending) split over steps 0..k-1 by
// LPT on FLOPs, then every other sample fills the steps' remaining counts in
// arrival order. False when a step's share exceeds its count.
inline bool long_first(const std::vector<int64_t>& lengths, const std::vector<double>& flops,
                       const std::vector<int32_t>& longest, const std::vector<int32_t>& counts, int32_t k,
                       std::vector<int32_t>& step) {
  const int32_t w = static_cast<int32_t>(counts.size());
  step.assign(lengths.size(), -1);
  std::vector<int32_t> room = counts;
  const auto shares = split_over_dp(lengths, flops, longest, k);
  for (int32_t s = 0; s < k; ++s) {
    if (static_cast<int32_t>(shares[s].size()) > room[s]) return false;
    room[s] -= static_cast<int32_t>(shares[s].size());
    for (int32_t q : shares[s]) step[q] = s;
  }
  int32_t s = 0;
  for (int32_t q = 0; q < static_cast<int32_t>(lengths.size()); ++q) {
    if (step[q] >= 0) continue;
    while (s < w && room[s] == 0) ++s;
    step[q] = s;  // counts sum to the sample count: a step has room
    --room[s];
  }
  return true;
}

// The swap search on `out`'s grouping (see the header comment).
template <class StepTime>
void swap_search(const std::vector<int64_t>& lengths, StepTime& step_time, Lookahead& out) {
  const int32_t w = static_cast<int32_t>(out.steps.size());
  int64_t work = 0;
  std::vector<int32_t> a, b;
  std::vector<int64_t> la, lb;
  const auto lengths_of = [&](const std::vector<int32_t>& members, std::vector<int64_t>& l) {
    l.clear();
    for (int32_t q : members) l.push_back(lengths[q]);
  };
  for (bool improved = true; improved && work < kLookaheadSwapWork;) {
    improved = false;
    for (int32_t s1 = 0; s1 < w && work < kLookaheadSwapWork; ++s1)
      for (int32_t s2 = s1 + 1; s2 < w && work < kLookaheadSwapWork; ++s2)
        for (size_t i = 0; i < out.steps[s1].size() && work < kLookaheadSwapWork; ++i)
          for (size_t j = 0; j < out.steps[s2].size() && work < kLookaheadSwapWork; ++j) {
            const int32_t q1 = out.steps[s1][i], q2 = out.steps[s2][j];
            if (lengths[q1] == lengths[q2]) continue;
            a = out.steps[s1];
            b = out.steps[s2];
            a[i] = q2;
            b[j] = q1;
            std::sort(a.begin(), a.end());  // a step's samples stay in arrival order
            std::sort(b.begin(), b.end());
            lengths_of(a, la);
            lengths_of(b, lb);
            work += static_cast<int64_t>(la.size() + lb.size());
            const double ta = static_cast<double>(step_time(la)), tb = static_cast<double>(step_time(lb));
            if (!(ta + tb < (out.step_us[s1] + out.step_us[s2]) * (1.0 - 1e-12))) continue;
            out.steps[s1].swap(a);
            out.steps[s2].swap(b);
            out.step[q1] = s2;
            out.step[q2] = s1;
            out.step_us[s1] = ta;
            out.step_us[s2] = tb;
            ++out.swaps;
            improved = true;
            i = out.steps[s1].size();  // step s1 changed: on to the next pair of steps
            break;
          }
  }
  out.window_us = 0.0;
  for (double t : out.step_us) out.window_us += t;
}

}  // namespace detail

// Regroups the window `batches` (each a global batch's lengths, in arrival
// order; W = batches.size()) over its W steps. `step_time(lengths)` returns
// the predicted time of one step planned on those lengths (the caller's
// policy and timeline). W = 1, or no candidate predicted faster, returns
// arrival order. Throws std::invalid_argument for W outside
// [1, kMaxLookahead], more than kMaxSequences samples, or a bad length.
template <class StepTime>
Lookahead lookahead(const std::vector<std::vector<int64_t>>& batches, const CostModel& cost, StepTime&& step_time) {
  const auto start = std::chrono::steady_clock::now();
  const int32_t w = static_cast<int32_t>(batches.size());
  if (batches.empty() || batches.size() > static_cast<size_t>(kMaxLookahead))
    throw std::invalid_argument("lookahead window must hold 1 to " + std::to_string(kMaxLookahead) +
                                " global batches, got " + std::to_string(batches.size()));
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

  std::vector<int64_t> step_lengths;
  std::vector<double> times(w);
  // Prices a grouping: each step's predicted time, summed.
  const auto price = [&](const std::vector<std::vector<int32_t>>& members, std::vector<double>& t) {
    double total = 0.0;
    for (int32_t s = 0; s < w; ++s) {
      step_lengths.clear();
      for (int32_t q : members[s]) step_lengths.push_back(lengths[q]);
      t[s] = step_lengths.empty() ? 0.0 : static_cast<double>(step_time(step_lengths));
      total += t[s];
    }
    ++out.candidates;
    return total;
  };

  out.step = arrival;
  out.steps = detail::members_of(arrival, w);
  out.arrival_us.assign(w, 0.0);
  out.arrival_window_us = price(out.steps, out.arrival_us);
  out.step_us = out.arrival_us;
  out.window_us = out.arrival_window_us;
  const auto consider = [&](const std::vector<int32_t>& step, double fraction, int32_t k) {
    auto members = detail::members_of(step, w);
    const double total = price(members, times);
    if (total < out.window_us) {
      out.window_us = total;
      out.step_us = times;
      out.step = step;
      out.steps = std::move(members);
      out.long_fraction = fraction;
      out.long_steps = k;
    }
  };

  if (w > 1 && n > 1) {
    std::vector<double> flops;
    detail::sequence_flops(lengths.data(), lengths.size(), cost, flops);
    std::vector<int32_t> order(n), scratch, step;
    for (int32_t q = 0; q < n; ++q) order[q] = q;
    detail::sort_descending_by_length(lengths, order, scratch);
    int32_t last_m = 0;
    for (double f : kLookaheadFractions) {
      const int32_t m = std::max<int32_t>(1, static_cast<int32_t>(f * n + 0.5));
      if (m == last_m || m >= n) continue;
      last_m = m;
      const std::vector<int32_t> longest(order.begin(), order.begin() + m);
      for (int32_t k = 1; k <= w; ++k)
        if (detail::long_first(lengths, flops, longest, counts, k, step)) consider(step, f, k);
    }
    // The whole window sorted, longest first, cut into the steps' counts.
    step.assign(n, 0);
    int32_t s = 0, used = 0;
    for (int32_t q : order) {
      while (used == counts[s]) ++s, used = 0;
      step[q] = s;
      ++used;
    }
    consider(step, 1.0, w);
    detail::swap_search(lengths, step_time, out);
  }
  for (int32_t q = 0; q < n; ++q) {
    const int32_t d = std::abs(out.step[q] - arrival[q]);
    out.moved += d != 0;
    out.max_delay = std::max(out.max_delay, d);
  }
  out.elapsed_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace skrull
