// Cost model (docs/design/cost_model.md): FLOPs, K/V volume, compute and
// communication time of one layer, and the predicted time of a DACP
// micro-batch. It knows nothing about scheduling; the scheduler takes it as a
// parameter.
//
// Units: lengths in tokens, FLOPs per layer of the forward pass, bytes,
// times in microseconds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace skrull {

// Accepted cost-model ranges (CostModel::validate). With types.hpp's limits
// they keep every FLOP count below 2^95 and every predicted time below 1e50
// us, so no sum the scheduler forms can reach infinity (the bounds are
// derived in docs/reliability.md). Larger values are unit mistakes.
constexpr int32_t kMaxLayers = 1 << 16;
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden, kv_width
constexpr double kMaxUsPerFlop = 1.0;            // a_us_per_flop: 1 MFLOP/s
constexpr double kMaxUs = 1e9;                   // b_us, comm.us, floor_us: 1000 s
constexpr double kMaxCollectivesPerLayer = 1e3;
constexpr double kMaxMicroBatchFixedUs = 1e9;    // micro_batch_fixed_us: 1000 s
constexpr int32_t kMaxTensorParallel = 1 << 10;   // tp
constexpr double kMaxTokenUs = 1e3;              // token_us: 1 ms a token
constexpr double kMaxAttentionWeight = 4.0;      // attention_weight: 4x the formula's attention term
constexpr double kMaxPlanMargin = 10.0;          // comm.plan_margin

// The forward's share of a forward + backward (backward ~ 2 forwards): what
// recomputing a checkpointed chunk's forward adds to its price
// (chunk_pass_us). Measured on CPU: 0.33-0.36 (docs/design/chunked.md).
constexpr double kRecomputeShare = 1.0 / 3.0;

struct ModelShape {
  int32_t layers = 24;        // transformer blocks
  int64_t hidden = 896;       // h
  int64_t kv_width = 128;     // h_kv = kv_heads * head_dim
  int32_t bytes_per_elem = 2; // bf16
  // Tensor-parallel degree: each rank holds n_heads / tp attention heads
  // (kv_width / tp of K/V) and 1 / tp of every projection and MLP column, so
  // a rank's FLOPs and the K/V bytes it exchanges over its CP group are the
  // layer's divided by tp. 1: no TP.
  int32_t tp = 1;
};

// Piecewise-linear latency of one collective by message size. Below
// threshold_bytes the latency is floor_us (the paper's t0); above the last
// point it extends the last segment (or stays flat with a single point).
struct CommModel {
  std::vector<double> bytes;  // ascending message sizes
  std::vector<double> us;     // latency at each size
  double threshold_bytes = 0.0;
  double floor_us = 0.0;
  // Collectives per layer on the distributed path: the forward all-gather of
  // K/V and the backward reduce-scatter of their gradients.
  double collectives_per_layer = 2.0;
  // Exchange time over a rank set spanning several CP groups (across nodes,
  // skrull-pool) over the same bytes inside one group (where the table was
  // measured). Conservative default: NVLink over InfiniBand per GPU is close
  // to 9x; a profile's [comm] cross_group_factor replaces it.
  double cross_group_factor = 9.0;
  // The planner decides with the exchange at plan_margin x its price and
  // prices the plan it keeps at 1x (hedge.hpp): an assumed table leaves
  // room for an exchange dearer than it says. 1: plan as priced (measured
  // profiles).
  double plan_margin = 1.0;
};

struct CostModel {
  ModelShape shape;
  // T_comp(F) = a_us_per_flop * F + b_us for the forward+backward of a
  // part of a layer whose forward costs F FLOPs (0 when F == 0).
  // Defaults for C++ callers and tests only: the product always passes a
  // measured profile or skrull_ext/scheduler/hardware/h100_assumed.toml (30 us per call).
  double a_us_per_flop = 7.5e-9;  // 3x fwd FLOPs at 400 TFLOP/s
  double b_us = 20.0;             // per-call overhead
  CommModel comm;
  // Fixed time of one micro-batch on every rank, whatever it holds (not per
  // layer): FSDP all-gathers each unit's parameters for the forward and again
  // for the backward, and reduce-scatters its gradients, once per
  // micro-batch; plus the per-call work outside the layers. Measured by the
  // profiler (docs/profile.md); 0 prices none of it (as before it existed).
  double micro_batch_fixed_us = 0.0;
  // Fixed time of one step, paid once whatever its micro-batches: under
  // free-running execution (FSDP parameters held unsharded for the step) the
  // first micro-batch's parameter all-gathers and the one gradient
  // reduce-scatter, which micro_batch_fixed_us then leaves out. A step of m
  // micro-batches pays step_fixed_us + m * micro_batch_fixed_us. 0 under
  // lockstep execution (every micro-batch pays its own gathers).
  double step_fixed_us = 0.0;
  // Time per token a rank holds in a micro-batch, outside the layers: the
  // embedding, the final norm, the output projection and the loss, forward
  // and backward. They run between the layers' synchronisation points, so a
  // micro-batch pays it for the rank holding the most tokens (a local
  // sequence's tokens on its rank, a sharded one's shard on each of its
  // ranks). A 152K vocabulary makes it microseconds a token on a GPU, which
  // no per-layer term holds (docs/design/cost_model.md). Measured by the
  // profiler; 0 prices none of it (profiles made before it existed).
  double token_us = 0.0;
  // Weight of the attention term (4 h s^2) against the linear ones in
  // flops(): what one FLOP of attention costs in units of a linear layer's
  // FLOP. The formula counts the full s x s score matrix, while causal flash
  // attention computes half of it, at its own rate; with one weight for both
  // a compiled Qwen2.5-0.5B layer on an H200 missed a buffer of 4 x 8,192
  // by 20% and trained steps ran x1.16-1.18 their prediction (the profiler
  // fitted 0.52 there: docs/design/cost_model.md). The profiler fits it from
  // single documents and packed buffers; 1 keeps the formula as published
  // (presets and profiles made before it existed).
  double attention_weight = 1.0;
  // Whether attention runs over a rank's buffer whole: one masked kernel
  // over all the documents of the buffer, which computes the buffer's full
  // square (the CPU's dense SDPA skips nothing its mask hides: 4 x 256
  // tokens took what one 1,024-token document took, 118.5 against 118.4 ms
  // a layer, docs/profile.md). Then a rank's local part costs
  // flops(its local tokens) and the distributed part, its queries over the
  // gathered K/V of every sharded sequence, flops(their total length) / cp
  // (local_flops, dist_flops below), where a varlen kernel (a GPU's) costs
  // the sum over documents. Read from the profile ([compute] whole_buffer,
  // written by the profiler for such a kernel); false prices per document,
  // as every profile made before it.
  bool whole_buffer = false;
  // The host floor of one layer call: on a GPU a short buffer's layer takes
  // the host's launch work (the compiled block's call and guards, FSDP's
  // hooks, kernel launches) whatever its FLOPs (docs/profile.md, "The host
  // floor": 4.34 ms a layer up to 8,192 tokens on run 9's H200, where the
  // line gives 1.03 ms at 2,048). Measured per layer call, a whole
  // transformer block's forward+backward, and charged once per layer call a
  // rank makes (layer_us): the trainer runs one block call per layer, whose
  // local and distributed attentions are two kernels inside it, so the floor
  // holds up the layer's device time, not each part (b_us stays per part:
  // each part is its own kernels). Read from the profile ([compute]
  // host_floor_us, written by the profiler where its fit found a floor); 0
  // prices the line alone, as every profile made before it.
  double host_floor_us = 0.0;
  // Whether a checkpointed chunk's recompute all-gathers its K/V again
  // (chunk_pass_us). Eager chunks (attention/prefix.py) hand the recompute
  // the K/V their forward gathered, which the next chunks keep as their
  // prefix anyway: no collective. A compiled job's chunks run through the
  // compiled blocks, whose recompute is the forward's graph again, the
  // gather inside it (train/chunk_path.py): the trainer sets it for them.
  // Not from the profile: the job's execution decides it, as free_running.
  bool chunk_regather = false;

  // Throws std::invalid_argument naming the first bad field. Every field
  // must be finite and within the k* limits above; comm.bytes strictly
  // ascending, at least one byte apart (bounds the extrapolated slope).
  void validate() const {
    auto fail = [](const std::string& what) { throw std::invalid_argument("cost model: " + what); };
    auto in = [](double v, double hi) { return std::isfinite(v) && v >= 0.0 && v <= hi; };
    // %g: 7.5e-09 and 1e+300 read as such (std::to_string prints fixed
    // point: 0.000000 and three hundred digits).
    auto num = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      return std::string(buf);
    };
    if (shape.layers < 1 || shape.layers > kMaxLayers)
      fail("layers must be in [1, " + std::to_string(kMaxLayers) + "], got " + std::to_string(shape.layers));
    if (shape.hidden < 1 || shape.hidden > kMaxWidth)
      fail("hidden must be in [1, " + std::to_string(kMaxWidth) + "], got " + std::to_string(shape.hidden));
    if (shape.kv_width < 1 || shape.kv_width > kMaxWidth)
      fail("kv_width must be in [1, " + std::to_string(kMaxWidth) + "], got " + std::to_string(shape.kv_width));
    if (shape.bytes_per_elem < 1 || shape.bytes_per_elem > 16)
      fail("bytes_per_elem must be in [1, 16], got " + std::to_string(shape.bytes_per_elem));
    if (shape.tp < 1 || shape.tp > kMaxTensorParallel)
      fail("tp must be in [1, " + std::to_string(kMaxTensorParallel) + "], got " + std::to_string(shape.tp));
    if (!in(a_us_per_flop, kMaxUsPerFlop))
      fail("a_us_per_flop must be finite and in [0, " + num(kMaxUsPerFlop) + "], got " + num(a_us_per_flop));
    if (!in(b_us, kMaxUs)) fail("b_us must be finite and in [0, " + num(kMaxUs) + "], got " + num(b_us));
    if (comm.bytes.size() != comm.us.size())
      fail("comm.bytes and comm.us differ in length (" + std::to_string(comm.bytes.size()) + " vs " +
           std::to_string(comm.us.size()) + ")");
    if (comm.bytes.empty()) fail("comm table needs at least one point");
    for (size_t i = 0; i < comm.bytes.size(); ++i) {
      if (!std::isfinite(comm.bytes[i]) || comm.bytes[i] < 0 || !in(comm.us[i], kMaxUs))
        fail("comm point " + std::to_string(i) + " must be finite and >= 0, latency <= " + num(kMaxUs) + " us");
      if (i > 0 && !(comm.bytes[i] > comm.bytes[i - 1]))
        fail("comm.bytes must be strictly ascending at point " + std::to_string(i));
      if (i > 0 && !(comm.bytes[i] - comm.bytes[i - 1] >= 1.0))
        fail("comm.bytes points " + std::to_string(i - 1) + " and " + std::to_string(i) +
             " must be at least one byte apart");
    }
    if (!std::isfinite(comm.threshold_bytes) || comm.threshold_bytes < 0)
      fail("comm.threshold_bytes must be finite and >= 0");
    if (!in(comm.floor_us, kMaxUs)) fail("comm.floor_us must be finite and in [0, " + num(kMaxUs) + "]");
    if (!(std::isfinite(comm.cross_group_factor) && comm.cross_group_factor >= 1.0 && comm.cross_group_factor <= 1e3))
      fail("comm.cross_group_factor must be finite and in [1, 1000], got " + num(comm.cross_group_factor));
    if (!in(comm.collectives_per_layer, kMaxCollectivesPerLayer))
      fail("comm.collectives_per_layer must be finite and in [0, " + num(kMaxCollectivesPerLayer) + "]");
    if (!(std::isfinite(comm.plan_margin) && comm.plan_margin >= 1.0 && comm.plan_margin <= kMaxPlanMargin))
      fail("comm.plan_margin must be finite and in [1, " + num(kMaxPlanMargin) + "], got " + num(comm.plan_margin));
    if (!(comm.collectives_per_layer * comm.plan_margin <= kMaxCollectivesPerLayer))
      fail("comm.collectives_per_layer x comm.plan_margin must be at most " + num(kMaxCollectivesPerLayer) + ", got " +
           num(comm.collectives_per_layer * comm.plan_margin));
    if (!in(micro_batch_fixed_us, kMaxMicroBatchFixedUs))
      fail("micro_batch_fixed_us must be finite and in [0, " + num(kMaxMicroBatchFixedUs) + "], got " +
           num(micro_batch_fixed_us));
    if (!in(step_fixed_us, kMaxMicroBatchFixedUs))
      fail("step_fixed_us must be finite and in [0, " + num(kMaxMicroBatchFixedUs) + "], got " + num(step_fixed_us));
    if (!in(token_us, kMaxTokenUs))
      fail("token_us must be finite and in [0, " + num(kMaxTokenUs) + "], got " + num(token_us));
    if (!(std::isfinite(attention_weight) && attention_weight > 0.0 && attention_weight <= kMaxAttentionWeight))
      fail("attention_weight must be finite and in (0, " + num(kMaxAttentionWeight) + "], got " +
           num(attention_weight));
    if (!in(host_floor_us, kMaxUs))
      fail("host_floor_us must be finite and in [0, " + num(kMaxUs) + "], got " + num(host_floor_us));
  }

  // Forward FLOPs of one layer for one sequence of s tokens on one rank of
  // its TP group: (20 h^2 s + 4 h h_kv s + w 4 h s^2) / tp (projections +
  // MLP, K/V, attention at attention_weight w; TP splits each term's heads
  // or columns evenly).
  double flops(int64_t s) const {
    const double h = static_cast<double>(shape.hidden);
    const double hkv = static_cast<double>(shape.kv_width);
    const double x = static_cast<double>(s);
    return (20.0 * h * h * x + 4.0 * h * hkv * x + attention_weight * 4.0 * h * x * x) / shape.tp;
  }

  // FLOPs of a rank's local part: `tokens` tokens whose documents' flops()
  // sum to `per_doc` (whole_buffer: one sequence of the buffer's length).
  double local_flops(int64_t tokens, double per_doc) const { return whole_buffer ? flops(tokens) : per_doc; }

  // One rank's FLOPs of the distributed part over n ranks: sequences of
  // `tokens` tokens in all whose flops() / n sum to `per_doc_share`
  // (whole_buffer: the rank's queries over the gathered K/V of all of them,
  // flops(tokens) / n).
  double dist_flops(int64_t tokens, double per_doc_share, int32_t n) const {
    return whole_buffer ? flops(tokens) / n : per_doc_share;
  }

  // K and V bytes of one layer for s tokens, as one rank of its TP group
  // holds and exchanges them (its kv_width / tp). A double: summed over a
  // micro-batch at the accepted extremes it would overflow int64.
  double kv_bytes(int64_t s) const {
    return 2.0 * static_cast<double>(s) * static_cast<double>(shape.kv_width) * shape.bytes_per_elem / shape.tp;
  }

  // The device's forward+backward time of one part of a layer (a rank's
  // local part, or its distributed part) of F forward FLOPs: the line
  // a F + b (0 when F == 0: the part is not run).
  double line_us(double f) const { return f > 0.0 ? a_us_per_flop * f + b_us : 0.0; }

  // One rank's layer call (docs/design/cost_model.md, "Time of a
  // micro-batch"): its exchange of comm_t us overlaps the local part, the
  // distributed part follows, and the whole call is held up to the host
  // floor when it runs either part:
  //   max(host_floor_us, max(comm_t, line(local_f)) + line(dist_f)).
  // The floor is once per call, not per part: the trainer runs both parts
  // inside one block call a layer (attention/dacp.py), the floor's unit.
  // With host_floor_us == 0 this is max(comm_t, line(local_f)) +
  // line(dist_f) bit for bit.
  double layer_us(double comm_t, double local_f, double dist_f) const {
    return held_to_floor_us(std::max(comm_t, line_us(local_f)) + line_us(dist_f), local_f > 0.0 || dist_f > 0.0);
  }

  // The floor rule alone: a layer call's device time held up to the host
  // floor when the call runs (it has FLOPs); a call that runs nothing is not
  // made, so no floor. layer_us applies it to a call's time, dacp_sweep's
  // bound to a lower bound on one.
  double held_to_floor_us(double device_us, bool runs) const {
    return runs ? std::max(host_floor_us, device_us) : device_us;
  }

  // A micro-batch's layers and fixed cost, the head left out, when its
  // slowest rank's layer call is layer_us(comm_t, local_f, dist_f): what the
  // heuristics compare while they move sequences between ranks
  // (micro_batch_us with most_tokens 0, from the slowest rank's parts).
  double layers_us(double comm_t, double local_f, double dist_f) const {
    return shape.layers * layer_us(comm_t, local_f, dist_f) + micro_batch_fixed_us;
  }

  // A layer call with one part of F FLOPs and no exchange: the line held up
  // to the host floor (0 when F == 0: no call).
  double comp_us(double f) const { return layer_us(0.0, f, 0.0); }

  // What `calls` micro-batches cost at least, however few FLOPs they hold:
  // each makes a call a layer at the host floor or more, plus its fixed
  // cost. Not additive under a floor (c calls cost at least c floors), so a
  // bound or estimate that sums FLOPs before pricing them is held up to this
  // as well (gds.hpp, slots.hpp, step_estimate.hpp, sim/bound.py).
  double floored_us(double calls) const { return calls * (shape.layers * host_floor_us + micro_batch_fixed_us); }

  // Latency of one collective moving `bytes`.
  double collective_us(double bytes) const {
    if (bytes <= 0.0) return 0.0;
    if (bytes < comm.threshold_bytes) return comm.floor_us;
    const auto& xs = comm.bytes;
    const auto& ys = comm.us;
    if (xs.size() == 1 || bytes <= xs.front()) return ys.front();
    size_t hi = static_cast<size_t>(std::upper_bound(xs.begin(), xs.end(), bytes) - xs.begin());
    if (hi >= xs.size()) hi = xs.size() - 1;  // extend the last segment
    const size_t lo = hi - 1;
    // A falling last segment, extended, would go below zero: clamp.
    return std::max(0.0, ys[lo] + (ys[hi] - ys[lo]) * (bytes - xs[lo]) / (xs[hi] - xs[lo]));
  }

  // Communication time of one layer (forward + backward collectives).
  double comm_us(double bytes) const { return comm.collectives_per_layer * collective_us(bytes); }

  // What a micro-batch pays outside its layers for the rank holding the most
  // tokens (token_us).
  double head_us(int64_t most_tokens) const { return token_us * static_cast<double>(most_tokens); }

  // Overlap formula (docs/design/cost_model.md, "Time of a micro-batch"), all
  // layers, plus the micro-batch's fixed cost and the head's time on the
  // rank holding the most tokens:
  //   Time_j = max(floor, max(T_comm(V), line(Local_j)) + line(Dist))   (layer_us);
  //   T = layers * max_j Time_j + micro_batch_fixed_us + token_us * max_j Tokens_j.
  // local_flops[j] is rank j's local FLOPs, dist_flops one rank's share,
  // most_tokens max_j Tokens_j (0: the layers and the fixed cost alone, what
  // the heuristics compare while they move sequences between ranks).
  double micro_batch_us(const std::vector<double>& local_flops, double dist_flops, double comm_bytes,
                        int64_t most_tokens = 0) const {
    const double comm_t = comm_us(comm_bytes);
    double worst = 0.0;
    for (double f : local_flops) worst = std::max(worst, layer_us(comm_t, f, dist_flops));
    return shape.layers * worst + micro_batch_fixed_us + head_us(most_tokens);
  }

  // A pad pass (timeline.hpp): what a rank runs at a lockstep slot where it
  // holds no micro-batch, and once in a free-running step where it holds
  // none. The trainer feeds every CP rank one ignored token, local
  // (data/steps/buffers.py pad_buffer: no distributed sequence, so no K/V
  // exchange at any CP), through every layer's forward and backward (one
  // block call a layer, with its FSDP calls and launches) and the head. So
  // it is priced as micro_batch_us prices that micro-batch:
  //   layers * layer_us(0, flops(1), 0) + micro_batch_fixed_us + head_us(1),
  // a layer call at the host floor or more, not the fixed cost alone.
  // (micro_batch_us({flops(1)}, 0, 0, 1) bit for bit, without its vector.)
  // A lockstep pad chunk runs more than this: pad_chunks_us.
  double pad_pass_us() const { return shape.layers * comp_us(flops(1)) + micro_batch_fixed_us + head_us(1); }

  // One chunk pass of a chunked document (train/chunked.py, attention/prefix.py):
  // `tokens` tokens after `prefix` earlier ones of the same document, sharded
  // over cp ranks (each computes 1/cp of the chunk's FLOPs, flops(prefix +
  // tokens) - flops(prefix): its linear layers and its queries over the prefix
  // and itself), its K/V all-gathered over the group (cp > 1) in each forward
  // and its gradient reduce-scattered in backward. `recomputed`: the chunk is
  // checkpointed (every pass but its position's last), so its forward runs
  // again in backward: kRecomputeShare more of the layers' line, the host
  // floor and the head, and, where the recompute gathers again
  // (chunk_regather: a traced chunk), one more all-gather, collective_us(V),
  // beside the forward's gather and the backward's reduce-scatter that
  // comm_us(V) prices (tests/unit_tests/test_pad_chunk.py counts them on a
  // gloo group). One
  // block call a layer holds its exchange (the next layer needs it), so the
  // floor holds up the call's device time once. `dense`: the attention rate
  // was fitted on a kernel that computes every (query, key) pair (CPU's
  // masked SDPA), so the chunk costs its tokens x (prefix + tokens)
  // rectangle at that rate (scheduler/chunk_cost.py's dense_fit). Plus the
  // chunk's call's fixed cost:
  //   layers * max(floor s, line(F) s + X) + token_us (tokens / cp) s + micro_batch_fixed_us,
  //   s = 1 + kRecomputeShare if recomputed else 1,
  //   X = comm_us(V) + (recomputed and chunk_regather ? collective_us(V) : 0), V = kv_bytes(tokens), 0 at cp 1.
  // chunk_cost.py sums it over a document's chunks; a lockstep pad chunk is
  // one of cp tokens (pad_chunks_us).
  double chunk_pass_us(int64_t prefix, int64_t tokens, int32_t cp, bool recomputed, bool dense = false) const {
    const double att = (flops(2) - 2.0 * flops(1)) / 2.0;  // flops(s) = lin s + att s^2
    double f = flops(prefix + tokens) - flops(prefix);    // lin t + att t (2 prefix + t)
    if (dense) f -= att * static_cast<double>(tokens) * static_cast<double>(prefix);
    f /= cp;
    const double v = kv_bytes(tokens);
    const double exchange = cp > 1 ? comm_us(v) + (recomputed && chunk_regather ? collective_us(v) : 0.0) : 0.0;
    const double share = recomputed ? 1.0 + kRecomputeShare : 1.0;
    return shape.layers * std::max(host_floor_us * share, line_us(f) * share + exchange) +
           (token_us * static_cast<double>(tokens) / cp * share + micro_batch_fixed_us);
  }

  // `count` consecutive lockstep pad chunks (scheduler/chunk_lockstep.py,
  // train/chunked.py pad_chunks): one ignored token a CP rank each, the first
  // after `start` tokens of its document (its padded length, 0 for an
  // all-pad document), each after the one before, the last not recomputed
  // (its position's last pass) and the others recomputed: chunk_pass_us(start
  // + j cp, cp, cp, j < count - 1) summed over j. In closed form (a rank may
  // pad 2^30 chunks): pad j's forward FLOPs a rank are f_0 + j d, d = 2 att
  // cp (its one query over cp more keys), so the recomputed ones sit at the
  // floor up to some j* and on the line after it.
  double pad_chunks_us(int64_t start, int64_t count, int32_t cp) const {
    if (count <= 0) return 0.0;
    const int64_t m = count - 1;  // recomputed pads
    const double last = chunk_pass_us(start + m * cp, cp, cp, false);
    if (m == 0) return last;
    const double s = 1.0 + kRecomputeShare;
    const double v = kv_bytes(cp);
    const double x = cp > 1 ? comm_us(v) + (chunk_regather ? collective_us(v) : 0.0) : 0.0;
    const double f0 = (flops(start + cp) - flops(start)) / cp;
    const double d = (flops(2) - 2.0 * flops(1)) * cp;  // 2 att cp: f_{j+1} - f_j
    const auto on_line = [&](int64_t j) {  // pad j's line at or above the floor
      return (a_us_per_flop * (f0 + static_cast<double>(j) * d) + b_us) * s + x >= host_floor_us * s;
    };
    int64_t k = 0;  // pads [0, k) at the floor, [k, m) on the line
    if (!on_line(0)) {
      k = m;
      const double slope = a_us_per_flop * d * s;
      if (slope > 0.0) {
        const double j = std::ceil((host_floor_us * s - (a_us_per_flop * f0 + b_us) * s - x) / slope);
        k = j < static_cast<double>(m) ? std::max<int64_t>(0, static_cast<int64_t>(j)) : m;
        while (k > 0 && on_line(k - 1)) --k;  // the rounding of j, either way
        while (k < m && !on_line(k)) ++k;
      }
    }
    const double n = static_cast<double>(m - k);
    const double js = (static_cast<double>(k) + static_cast<double>(m - 1)) * n / 2.0;  // sum of j over [k, m)
    const double layers = shape.layers;
    return last + static_cast<double>(k) * layers * host_floor_us * s +
           layers * (n * ((a_us_per_flop * f0 + b_us) * s + x) + a_us_per_flop * d * s * js) +
           static_cast<double>(m) * (token_us * static_cast<double>(cp) / cp * s + micro_batch_fixed_us);
  }

  // A lower bound on any DACP plan's time for these lengths on n ranks:
  // the max over ranks of local+dist FLOPs is at least the average, total/n.
  // With a non-decreasing comm table, the longest sequence also bounds it:
  // whole on one rank, or sharded and paying at least its own exchange.
  // The micro-batch's fixed cost is paid once, whatever the plan, and the
  // rank holding the most tokens pays token_us for at least tokens / n.
  // seq_flops[i] = flops(lengths[i]) when the caller has them, else null.
  // It bounds whole_buffer's prices too: a buffer's flops() is at least the
  // sum over its documents (the linear terms add; a sum's square is at
  // least the sum of the squares).
  double micro_batch_lower_bound_us(const int64_t* lengths, size_t count, int32_t n,
                                    const double* seq_flops = nullptr) const {
    double total = 0.0;
    double tokens = 0.0;
    int64_t longest = 0;
    for (size_t i = 0; i < count; ++i) {
      total += seq_flops ? seq_flops[i] : flops(lengths[i]);
      tokens += static_cast<double>(lengths[i]);
      longest = std::max(longest, lengths[i]);
    }
    if (total <= 0.0) return 0.0;
    // Some rank makes a layer call: the floor bounds it too.
    double bound = std::max(a_us_per_flop * total / n + b_us, host_floor_us);
    if (comm_is_monotone() && n > 1) {
      const double f = flops(longest);
      const double as_local = comp_us(f);
      const double as_dist = layer_us(comm_us(kv_bytes(longest)), 0.0, f / n);
      bound = std::max(bound, std::min(as_local, as_dist));
    }
    // Some rank holds at least the average tokens.
    return shape.layers * bound + micro_batch_fixed_us + token_us * tokens / n;
  }
  double micro_batch_lower_bound_us(const std::vector<int64_t>& lengths, int32_t n) const {
    return micro_batch_lower_bound_us(lengths.data(), lengths.size(), n);
  }

  bool comm_is_monotone() const {
    if (comm.threshold_bytes > 0.0 && !comm.us.empty() && comm.floor_us > comm.us.front()) return false;
    for (size_t i = 1; i < comm.us.size(); ++i)
      if (comm.us[i] < comm.us[i - 1]) return false;
    return true;
  }
};

// Tokens one CP rank holds of a sequence of s tokens sharded over n ranks:
// padded to a multiple of 2n and cut into 2n zigzag chunks, two per rank.
inline int64_t shard_tokens(int64_t s, int32_t n) {
  if (n <= 1) return s;
  const int64_t chunks = 2 * static_cast<int64_t>(n);
  return 2 * ((s + chunks - 1) / chunks);
}

// Tokens `groups` CP groups of cp ranks hold at `bucket` tokens a rank (one
// lockstep slot: groups = dp). bucket x cp <= 2^52 in the accepted ranges,
// but times a DP count of up to 2^16 it would pass int64 (found by the facade
// property test: dp = cp = 2^16, bucket 2^36, a SIGFPE in the count search).
// Saturates at 2^61: every token sum is <= 2^60, so a larger capacity would
// compare with them exactly as the cap does.
inline int64_t group_capacity(int64_t bucket, int64_t cp, int64_t groups = 1) {
  constexpr int64_t kCap = int64_t{1} << 61;
  const int64_t group = bucket * cp;
  return group > kCap / groups ? kCap : group * groups;
}

// Longest sequence n ranks (a CP group, or a pool world of dp x cp) with
// `bucket` tokens each can hold. (Whole on one rank it may be `bucket` long;
// sharded, each rank holds two chunks of at most bucket/2 tokens.) Saturates
// at INT64_MAX instead of wrapping: a world may have 2^32 ranks.
inline int64_t max_sequence_length(int64_t bucket, int64_t n) {
  if (n <= 1) return bucket;
  const int64_t half = bucket / 2;
  if (half > 0 && n > std::numeric_limits<int64_t>::max() / (2 * half)) return std::numeric_limits<int64_t>::max();
  return std::max(bucket, 2 * n * half);
}

}  // namespace skrull
