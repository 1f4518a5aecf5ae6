// Test-only oracle for skrull::lookahead (lookahead.hpp), used by the fuzzer:
// whether a window must be accepted (the documented ranges, restated), and
// whether an answer keeps what lookahead.hpp and docs/design/lookahead.md
// promise, checked with plain arithmetic and the caller's step planner:
// every sample of the window at exactly one step, each step keeping the
// count of samples that arrived in it, delays within W - 1, every price the
// full planner's (each step re-planned here, bit for bit), the window never
// predicted slower than arrival order, and the budgets' counters within
// their bounds. The twin of plan_check.hpp for a window.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "plan_check.hpp"
#include "skrull/lookahead.hpp"

namespace skrull::check {

// Empty when lookahead() must accept the window, else why it must refuse it.
// The window's own ranges first (W in [1, kMaxLookahead], W lists of chunked
// documents or none, each list's, the cost model's, each batch's lengths, the
// window's sequence count); then the step planner's: lookahead prices every
// step in arrival order before anything else, calling the planner on each
// step that holds a sample or a chunked document, so a step the planner
// refuses (`step_rejection(lengths, docs)`: its options, its over-length
// rule, sequences x cp) refuses the window. A regrouped step keeps an
// arrival step's sequence count and only arrival steps' sequences, so it
// can add no refusal of its own.
template <class StepRejection>
std::string lookahead_rejection(const std::vector<std::vector<int64_t>>& batches,
                                const std::vector<ChunkedDocs>& chunked, const CostModel& c,
                                StepRejection&& step_rejection) {
  if (batches.empty() || batches.size() > static_cast<size_t>(kMaxLookahead)) return "window size";
  if (!chunked.empty() && chunked.size() != batches.size()) return "chunked lists";
  for (const ChunkedDocs& d : chunked) {
    const std::string r = chunked_rejection(d.us, d.chunks);
    if (!r.empty()) return r;
  }
  const std::string cost = cost_rejection(c);
  if (!cost.empty()) return cost;
  size_t n = 0;
  for (const auto& b : batches) {
    if (b.size() > (size_t{1} << 24)) return "too many sequences in a batch";
    for (int64_t s : b)
      if (s < 1 || s > (int64_t{1} << 36)) return "length range";
    n += b.size();
  }
  if (n > (size_t{1} << 24)) return "too many sequences in the window";
  const ChunkedDocs none;
  for (size_t b = 0; b < batches.size(); ++b) {
    const ChunkedDocs& d = chunked.empty() ? none : chunked[b];
    if (batches[b].empty() && d.empty()) continue;  // priced 0 without the planner
    const std::string r = step_rejection(batches[b], d);
    if (!r.empty()) return "global batch " + std::to_string(b) + ": " + r;
  }
  return "";
}

// Empty when `a` is a sound answer for the window, else what is wrong.
// `price(lengths, docs)` is the step planner lookahead was given (its
// predicted step time); each step is re-planned with it on the step's
// samples in arrival order, as lookahead plans them.
template <class Price>
std::string lookahead_error(const std::vector<std::vector<int64_t>>& batches,
                            const std::vector<ChunkedDocs>& chunked, const Lookahead& a, Price&& price) {
  const int32_t w = static_cast<int32_t>(batches.size());
  std::vector<int32_t> arrival;
  if (a.offsets.size() != batches.size() + 1 || a.offsets[0] != 0) return "offsets size";
  for (int32_t b = 0; b < w; ++b) {
    if (a.offsets[b + 1] - a.offsets[b] != static_cast<int64_t>(batches[b].size())) return "offsets";
    arrival.insert(arrival.end(), batches[b].size(), b);
  }
  const size_t n = arrival.size();
  std::vector<int64_t> flat;
  for (const auto& b : batches) flat.insert(flat.end(), b.begin(), b.end());
  if (a.step.size() != n) return "one step per sample";
  std::vector<std::vector<int32_t>> members(w);
  int32_t moved = 0, delay = 0;
  for (size_t q = 0; q < n; ++q) {
    if (a.step[q] < 0 || a.step[q] >= w) return "a sample's step out of the window";
    members[a.step[q]].push_back(static_cast<int32_t>(q));
    const int32_t d = std::abs(a.step[q] - arrival[q]);
    moved += d != 0;
    delay = std::max(delay, d);
  }
  // Each sample once (one step each, above); each step as many as arrived in it.
  for (int32_t s = 0; s < w; ++s)
    if (members[s].size() != batches[s].size()) return "a step's sample count changed";
  if (a.steps() != members) return "steps() is not the map's";
  if (a.moved != moved || a.max_delay != delay || delay > w - 1) return "moved or max_delay";
  if (a.step_us.size() != batches.size() || a.arrival_us.size() != batches.size()) return "per-step times' size";
  // Every price is the full planner's on the step's samples in arrival order.
  const ChunkedDocs none;
  std::vector<int64_t> lengths;
  double window = 0.0, arrival_window = 0.0;
  for (int32_t s = 0; s < w; ++s) {
    const ChunkedDocs& d = chunked.empty() ? none : chunked[s];
    const double at_arrival = batches[s].empty() && d.empty() ? 0.0 : static_cast<double>(price(batches[s], d));
    if (a.arrival_us[s] != at_arrival) return "an arrival step's time is not its plan's";
    lengths.clear();
    for (int32_t q : members[s]) lengths.push_back(flat[q]);
    const double t = lengths.empty() && d.empty() ? 0.0 : static_cast<double>(price(lengths, d));
    if (a.step_us[s] != t) return "a regrouped step's time is not its plan's";
    window += a.step_us[s];
    arrival_window += a.arrival_us[s];
  }
  if (a.window_us != window || a.arrival_window_us != arrival_window) return "window times are not their steps' sums";
  if (!(a.window_us <= a.arrival_window_us)) return "the window predicted slower than arrival order";
  if (a.step == arrival && a.window_us != a.arrival_window_us) return "arrival order priced twice differently";
  // The chosen candidate: arrival order (0, 0), a long-first fraction over k <= W steps, or the sort (1, W).
  bool fraction = a.long_fraction == 0.0 || a.long_fraction == 1.0;
  for (double f : kLookaheadFractions) fraction = fraction || a.long_fraction == f;
  if (!fraction || (a.long_fraction == 0.0) != (a.long_steps == 0) || a.long_steps < 0 || a.long_steps > w ||
      (a.long_fraction == 1.0 && a.long_steps != w))
    return "long_fraction or long_steps";
  if (a.step != arrival && a.long_fraction == 0.0 && a.swaps == 0) return "regrouped by neither a candidate nor a swap";
  // A long-first split: over k steps of the ladder (every k to 8, then 12, 16, 24, 32, ... below W, and W).
  if (a.long_fraction > 0.0 && a.long_fraction < 1.0) {
    int32_t odd = a.long_steps;
    while (odd > 0 && odd % 2 == 0) odd /= 2;
    if (!(a.long_steps <= 8 || a.long_steps == w || (a.long_steps >= 12 && (odd == 1 || odd == 3))))
      return "long_steps off the ladder";
  }
  // Budgets: arrival order and the first finalist (n each), then kLookaheadPlanWork sequences.
  const int64_t most_screened =
      static_cast<int64_t>(std::size(kLookaheadFractions) * detail::screened_steps(w).size()) + 1;
  if (a.candidates < 1 || a.screened < 0 || a.screened > most_screened || a.candidates > 1 + a.screened ||
      a.planned < 0 || a.planned > 2 * static_cast<int64_t>(n) + kLookaheadPlanWork || a.swap_trials < 0 ||
      a.swap_trials > kLookaheadScreenWork || a.swaps < 0 || a.swaps > a.swap_trials ||
      a.swap_visits < a.swap_trials || a.swap_visits > kLookaheadSwapVisits)
    return "a counter outside its budget";
  if ((w == 1 || n <= 1) && (a.step != arrival || a.candidates != 1 || a.screened != 0 || a.swap_visits != 0))
    return "a window with nothing to regroup was regrouped";
  if (!std::isfinite(a.elapsed_us) || a.elapsed_us < 0.0) return "elapsed_us";
  return "";
}

// The same answer bit for bit, but for the wall time.
inline bool same_lookahead(const Lookahead& x, const Lookahead& y) {
  return x.offsets == y.offsets && x.step == y.step && x.step_us == y.step_us && x.arrival_us == y.arrival_us &&
         x.window_us == y.window_us && x.arrival_window_us == y.arrival_window_us && x.moved == y.moved &&
         x.max_delay == y.max_delay && x.long_fraction == y.long_fraction && x.long_steps == y.long_steps &&
         x.candidates == y.candidates && x.screened == y.screened && x.swaps == y.swaps &&
         x.swap_trials == y.swap_trials && x.swap_visits == y.swap_visits && x.planned == y.planned;
}

}  // namespace skrull::check
