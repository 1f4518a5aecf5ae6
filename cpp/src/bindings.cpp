// Python bindings of the scheduler core: conversions only. The scheduling
// calls release the GIL, so dataloader threads can schedule concurrently;
// they take the cost model and options by value, copied while the GIL is
// held, so another thread changing the Python objects meanwhile cannot
// change them under the running scheduler.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <sstream>
#include <string>

#include "skrull/cost_model.hpp"
#include "skrull/dacp.hpp"
#include "skrull/dacp_sweep.hpp"
#include "skrull/hedge.hpp"
#include "skrull/chunked.hpp"
#include "skrull/lookahead.hpp"
#include "skrull/plan.hpp"
#include "skrull/pool.hpp"
#include "skrull/scheduler.hpp"
#include "skrull/timeline.hpp"
#include "skrull/types.hpp"

#define STRINGIFY(x) #x
#define MACRO_STRINGIFY(x) STRINGIFY(x)

namespace py = pybind11;
using namespace skrull;

namespace skrull_py {
// A global batch's lengths as schedule() receives them. Its own caster
// reads a plain list of ints straight from the list (a third of the
// generic conversion's time, which is a tenth of a paper-sized batch's
// schedule); anything else goes through the generic vector caster, so
// what is accepted and the TypeError for what is not are unchanged.
struct Lengths {
  std::vector<int64_t> v;
};
}  // namespace skrull_py

namespace pybind11::detail {
template <>
struct type_caster<skrull_py::Lengths> {
  PYBIND11_TYPE_CASTER(skrull_py::Lengths, const_name("Sequence[int]"));
  bool load(handle src, bool convert) {
    if (PyList_CheckExact(src.ptr())) {
      const Py_ssize_t n = PyList_GET_SIZE(src.ptr());
      value.v.resize(static_cast<size_t>(n));
      bool exact = true;
      for (Py_ssize_t i = 0; i < n && exact; ++i) {
        PyObject* item = PyList_GET_ITEM(src.ptr(), i);
        int overflow = 0;
        exact = PyLong_CheckExact(item);
        if (exact) value.v[static_cast<size_t>(i)] = PyLong_AsLongLongAndOverflow(item, &overflow);
        exact = exact && overflow == 0;
      }
      if (exact) return true;
    }
    make_caster<std::vector<int64_t>> generic;
    if (!generic.load(src, convert)) return false;
    value.v = std::move(static_cast<std::vector<int64_t>&>(generic));
    return true;
  }
};
}  // namespace pybind11::detail

// A pool plan's micro-batches as the timeline functions take them: in range and finite.
static void check_slot_times(const std::vector<SlotTime>& mbs, int32_t dp) {
  validate_group(dp, 1);
  for (const SlotTime& mb : mbs)
    if (mb.slot < 0 || mb.groups < 1 || mb.first_group < 0 || mb.first_group + mb.groups > dp ||
        !(mb.time_us >= 0.0 && mb.time_us < 1e300))
      throw std::invalid_argument("a pool micro-batch's slot, groups or time is out of range");
}

// Per-group work after the micro-batches (chunked documents), as the timeline functions take it: none, or
// one finite time >= 0 per group.
static void check_after(const std::vector<double>& after_us, int32_t dp) {
  if (after_us.empty()) return;
  if (static_cast<int32_t>(after_us.size()) != dp)
    throw std::invalid_argument("after_us has " + std::to_string(after_us.size()) + " entries for " +
                                std::to_string(dp) + " groups");
  validate_chunked(after_us);
}

// Chunked documents' chunk counts and DP ranks, as the lockstep pad rule takes them: dp >= 1, one
// count >= 1 and one rank in [0, dp) per document.
static void check_lockstep(const std::vector<int32_t>& chunks, const std::vector<int32_t>& groups, int32_t dp) {
  validate_group(dp, 1);
  validate_chunk_counts(chunks, chunks.size());
  validate_chunked_ranks(groups, chunks.size(), dp);
}

PYBIND11_MODULE(_core, m, py::mod_gil_not_used()) {
  m.doc() = "Skrull scheduler core: cost model, DACP and GDS (C++).";

  py::enum_<Status>(m, "Status").value("OK", Status::kOk).value("UNSCHEDULABLE", Status::kUnschedulable);
  py::enum_<Placement>(m, "Placement")
      .value("LEAST_LOAD", Placement::kLeastLoad)
      .value("WORST_FIT", Placement::kWorstFit);
  py::enum_<Rollback>(m, "Rollback").value("LONGEST", Rollback::kLongest).value("SHORTEST", Rollback::kShortest);
  py::enum_<MicroBatchCount>(m, "MicroBatchCount")
      .value("SMALLEST_FEASIBLE", MicroBatchCount::kSmallestFeasible)
      .value("PREDICTED_TIME", MicroBatchCount::kPredictedTime);
  py::enum_<DacpSearch>(m, "DacpSearch")
      .value("HEURISTIC", DacpSearch::kHeuristic)
      .value("SHARD_SWEEP", DacpSearch::kShardSweep);
  py::enum_<Timeline>(m, "Timeline")
      .value("LOCKSTEP", Timeline::kLockstep)
      .value("FREE_RUNNING", Timeline::kFreeRunning);
  py::enum_<Overlength>(m, "Overlength")
      .value("ERROR", Overlength::kError)
      .value("TRUNCATE", Overlength::kTruncate)
      .value("DROP", Overlength::kDrop);

  m.attr("DISTRIBUTED") = kDistributed;
  m.attr("DROPPED") = kDropped;
  m.attr("MAX_LENGTH") = kMaxLength;
  m.attr("RECOMPUTE_SHARE") = kRecomputeShare;
  m.attr("MAX_BUCKET_SIZE") = kMaxBucketSize;
  m.attr("MAX_SEQUENCES") = kMaxSequences;
  m.attr("MAX_SEQUENCE_RANKS") = kMaxSequenceRanks;
  m.attr("MAX_RANKS") = kMaxRanks;
  m.attr("MAX_PLAN_MARGIN") = kMaxPlanMargin;
  m.attr("MAX_LOOKAHEAD") = kMaxLookahead;

  py::class_<ModelShape>(m, "ModelShape")
      .def(py::init([](int32_t layers, int64_t hidden, int64_t kv_width, int32_t bytes_per_elem, int32_t tp) {
             return ModelShape{layers, hidden, kv_width, bytes_per_elem, tp};
           }),
           py::arg("layers"), py::arg("hidden"), py::arg("kv_width"), py::arg("bytes_per_elem") = 2,
           py::arg("tp") = 1)
      .def_readwrite("layers", &ModelShape::layers)
      .def_readwrite("hidden", &ModelShape::hidden)
      .def_readwrite("kv_width", &ModelShape::kv_width)
      .def_readwrite("bytes_per_elem", &ModelShape::bytes_per_elem)
      .def_readwrite("tp", &ModelShape::tp)
      .def("__repr__", [](const ModelShape& s) {
        std::ostringstream os;
        os << "ModelShape(layers=" << s.layers << ", hidden=" << s.hidden << ", kv_width=" << s.kv_width
           << ", bytes_per_elem=" << s.bytes_per_elem << (s.tp != 1 ? ", tp=" + std::to_string(s.tp) : "") << ")";
        return os.str();
      });

  py::class_<CommModel>(m, "CommModel")
      .def(py::init([](std::vector<double> bytes, std::vector<double> us, double threshold_bytes, double floor_us,
                       double collectives_per_layer, double cross_group_factor, double plan_margin) {
             return CommModel{std::move(bytes), std::move(us), threshold_bytes, floor_us, collectives_per_layer,
                              cross_group_factor, plan_margin};
           }),
           py::arg("bytes"), py::arg("us"), py::arg("threshold_bytes") = 0.0, py::arg("floor_us") = 0.0,
           py::arg("collectives_per_layer") = 2.0, py::arg("cross_group_factor") = 9.0, py::arg("plan_margin") = 1.0)
      .def_readwrite("bytes", &CommModel::bytes)
      .def_readwrite("us", &CommModel::us)
      .def_readwrite("threshold_bytes", &CommModel::threshold_bytes)
      .def_readwrite("floor_us", &CommModel::floor_us)
      .def_readwrite("collectives_per_layer", &CommModel::collectives_per_layer)
      .def_readwrite("cross_group_factor", &CommModel::cross_group_factor,
                     "Exchange time across CP groups over the same bytes inside one (skrull-pool's wide sets).")
      .def_readwrite("plan_margin", &CommModel::plan_margin,
                     "The planner decides with the exchange at this multiple of its price and prices the plan at 1x "
                     "(hedge.hpp); 1 for measured profiles.");

  py::class_<CostModel>(m, "CostModel", "Per-layer cost model of docs/design/cost_model.md (tokens, FLOPs, bytes, microseconds).")
      .def(py::init([](const ModelShape& shape, double a_us_per_flop, double b_us, const CommModel& comm,
                       double micro_batch_fixed_us, double step_fixed_us, double token_us, double attention_weight,
                       bool whole_buffer, double host_floor_us, bool chunk_regather) {
             CostModel c{shape, a_us_per_flop, b_us, comm, micro_batch_fixed_us, step_fixed_us, token_us,
                         attention_weight, whole_buffer, host_floor_us, chunk_regather};
             c.validate();
             return c;
           }),
           py::arg("shape"), py::arg("a_us_per_flop"), py::arg("b_us"), py::arg("comm"),
           py::arg("micro_batch_fixed_us") = 0.0, py::arg("step_fixed_us") = 0.0, py::arg("token_us") = 0.0,
           py::arg("attention_weight") = 1.0, py::arg("whole_buffer") = false, py::arg("host_floor_us") = 0.0,
           py::arg("chunk_regather") = false)
      // Copies: a CostModel is immutable once validated (build a new one).
      .def_property_readonly("shape", [](const CostModel& c) { return c.shape; })
      .def_readonly("a_us_per_flop", &CostModel::a_us_per_flop)
      .def_readonly("b_us", &CostModel::b_us)
      .def_readonly("micro_batch_fixed_us", &CostModel::micro_batch_fixed_us,
                    "Fixed time of one micro-batch (FSDP gathers and reduce-scatters), not per layer.")
      .def_readonly("step_fixed_us", &CostModel::step_fixed_us,
                    "Fixed time of one step, paid once (free-running: the first gathers and the one reduction).")
      .def_readonly("token_us", &CostModel::token_us,
                    "Time per token a rank holds in a micro-batch outside the layers (embedding, head, loss).")
      .def_readonly("attention_weight", &CostModel::attention_weight,
                    "Weight of the attention term in flops() against the linear ones (fitted by the profiler).")
      .def_readonly("whole_buffer", &CostModel::whole_buffer,
                    "Attention runs over a rank's buffer whole (CPU dense SDPA): each part priced as one sequence "
                    "of its length, not per document (the profile's [compute] whole_buffer).")
      .def_readonly("host_floor_us", &CostModel::host_floor_us,
                    "Host floor of one layer call, once per call: layer_us = max(floor, max(comm, line(local)) + "
                    "line(dist)) (the profile's [compute] host_floor_us; 0: the line alone).")
      .def_readonly("chunk_regather", &CostModel::chunk_regather,
                    "A checkpointed chunk's recompute all-gathers its K/V again (a compiled job's traced chunks); "
                    "false: it reuses the forward's (eager chunks).")
      .def("local_flops", &CostModel::local_flops, py::arg("tokens"), py::arg("per_doc"),
           "FLOPs of a rank's local part of `tokens` tokens whose documents' flops() sum to per_doc.")
      .def("dist_flops", &CostModel::dist_flops, py::arg("tokens"), py::arg("per_doc_share"), py::arg("cp"),
           "One rank's FLOPs of the distributed part: sequences of `tokens` tokens whose flops() / cp sum to "
           "per_doc_share.")
      .def_property_readonly("comm", [](const CostModel& c) { return c.comm; })
      .def("flops", &CostModel::flops, py::arg("length"), "Forward FLOPs of one layer for one sequence.")
      .def("kv_bytes", &CostModel::kv_bytes, py::arg("length"), "K and V bytes of one layer.")
      .def("line_us", &CostModel::line_us, py::arg("flops"),
           "Device fwd+bwd time of one part of a layer of F forward FLOPs: a F + b (0 when F == 0).")
      .def("layer_us", &CostModel::layer_us, py::arg("comm_us"), py::arg("local_flops"), py::arg("dist_flops"),
           "One rank's layer call: max(floor, max(comm_us, line(local)) + line(dist)), the floor once per call "
           "(when it runs a part).")
      .def("comp_us", &CostModel::comp_us, py::arg("flops"),
           "A layer call of one part of F forward FLOPs, no exchange: the line held up to the host floor.")
      .def("floored_us", &CostModel::floored_us, py::arg("calls"),
           "What `calls` micro-batches cost at least: calls x (layers x host floor + micro_batch_fixed_us).")
      .def("pad_pass_us", &CostModel::pad_pass_us,
           "A pad pass (a rank's idle lockstep slot; free-running at DP > 1, a rank with no micro-batch): one local "
           "token a CP rank through every layer and the head, priced as micro_batch_us prices it: layers x "
           "comp_us(flops(1)) + micro_batch_fixed_us + head_us(1).")
      .def("chunk_pass_us", &CostModel::chunk_pass_us, py::arg("prefix"), py::arg("tokens"), py::arg("cp"),
           py::arg("recomputed"), py::arg("dense") = false,
           "One chunk pass of a chunked document: `tokens` tokens after `prefix` sharded over cp ranks, its K/V "
           "gathered (again in its recompute when `recomputed`), layers x max(floor s, line(F) s + X) + token_us "
           "tokens / cp s + micro_batch_fixed_us (s = 1 + RECOMPUTE_SHARE if recomputed).")
      .def("pad_chunks_us", &CostModel::pad_chunks_us, py::arg("start"), py::arg("count"), py::arg("cp"),
           "`count` consecutive lockstep pad chunks (one token a CP rank each) from `start` tokens of their "
           "document, the last not recomputed: chunk_pass_us(start + j cp, cp, cp, j < count - 1) summed.")
      .def("collective_us", &CostModel::collective_us, py::arg("bytes"), "Latency of one collective.")
      .def("comm_us", &CostModel::comm_us, py::arg("bytes"), "Communication time of one layer.")
      .def("micro_batch_us", &CostModel::micro_batch_us, py::arg("local_flops"), py::arg("dist_flops"),
           py::arg("comm_bytes"), py::arg("most_tokens") = 0,
           "Predicted micro-batch time (overlap formula, all layers; the head's time for most_tokens, the "
           "tokens of the rank holding the most).")
      .def(
          "micro_batch_lower_bound_us",
          [](const CostModel& c, const std::vector<int64_t>& lengths, int32_t cp) {
            validate_group(cp, 1);
            validate_lengths(lengths, "micro-batch");
            return c.micro_batch_lower_bound_us(lengths, cp);
          },
          py::arg("lengths"), py::arg("cp"),
           "A lower bound on any DACP plan's time for these lengths.")
      .def("comm_is_monotone", &CostModel::comm_is_monotone)
      .def("planning_model", &planning_model,
           "The model the planner decides with: every exchange at comm.plan_margin x its price (hedge.hpp).");

  py::class_<Options>(m, "Options")
      .def(py::init<>())
      .def_readwrite("dp", &Options::dp)
      .def_readwrite("cp", &Options::cp)
      .def_readwrite("bucket_size", &Options::bucket_size)
      .def_readwrite("placement", &Options::placement)
      .def_readwrite("rollback", &Options::rollback)
      .def_readwrite("micro_batch_count", &Options::micro_batch_count)
      .def_readwrite("dacp_search", &Options::dacp_search)
      .def_readwrite("max_extra_micro_batches", &Options::max_extra_micro_batches)
      .def_readwrite("refine", &Options::refine)
      .def_readwrite("sweep_margin", &Options::sweep_margin)
      .def_readwrite("overlength", &Options::overlength)
      .def_readwrite("timeline", &Options::timeline)
      .def_readwrite("slot_gds", &Options::slot_gds)
      .def_readwrite("pool_widen", &Options::pool_widen);

  py::class_<DacpResult>(m, "DacpResult")
      .def_readonly("status", &DacpResult::status)
      .def_readonly("cp_rank", &DacpResult::cp_rank)
      .def_readonly("rank_tokens", &DacpResult::rank_tokens)
      .def_readonly("rank_flops", &DacpResult::rank_flops)
      .def_readonly("comm_bytes", &DacpResult::comm_bytes)
      .def_readonly("time_us", &DacpResult::time_us)
      .def_readonly("rollbacks", &DacpResult::rollbacks)
      .def_readonly("moves", &DacpResult::moves)
      .def("__repr__", [](const DacpResult& r) {
        std::ostringstream os;
        os << "DacpResult(status=" << static_cast<int>(r.status) << ", time_us=" << r.time_us
           << ", rollbacks=" << r.rollbacks << ")";
        return os.str();
      });

  py::class_<MicroBatch>(m, "MicroBatch")
      .def_readonly("dp_rank", &MicroBatch::dp_rank)
      .def_readonly("index", &MicroBatch::index)
      .def_readonly("seqs", &MicroBatch::seqs)
      .def_readonly("dacp", &MicroBatch::dacp);

  py::class_<Schedule>(m, "Schedule")
      .def_readonly("lengths", &Schedule::lengths)
      .def_readonly("dp_rank", &Schedule::dp_rank)
      .def_readonly("micro_batch", &Schedule::micro_batch)
      .def_readonly("cp_rank", &Schedule::cp_rank)
      .def_readonly("micro_batches", &Schedule::micro_batches)
      .def_readonly("dp_offsets", &Schedule::dp_offsets)
      .def_readonly("dp_time_us", &Schedule::dp_time_us)
      .def_readonly("makespan_us", &Schedule::makespan_us)
      .def_readonly("dropped", &Schedule::dropped)
      .def_readonly("truncated", &Schedule::truncated)
      .def_readonly("chunked_us", &Schedule::chunked_us)
      .def_readonly("chunked_dp_rank", &Schedule::chunked_dp_rank)
      .def_readonly("chunked_chunks", &Schedule::chunked_chunks)
      .def_readonly("chunked_lengths", &Schedule::chunked_lengths)
      .def_readonly("chunked_last_chunk", &Schedule::chunked_last_chunk)
      .def_readonly("chunked_pad_us", &Schedule::chunked_pad_us)
      .def_readonly("rollbacks", &Schedule::rollbacks)
      .def_readonly("moves", &Schedule::moves)
      .def_readonly("elapsed_us", &Schedule::elapsed_us);

  py::class_<PlanMicroBatch>(m, "PlanMicroBatch")
      .def_readonly("slot", &PlanMicroBatch::slot)
      .def_readonly("first_group", &PlanMicroBatch::first_group)
      .def_readonly("groups", &PlanMicroBatch::groups)
      .def_readonly("seqs", &PlanMicroBatch::seqs)
      .def_readonly("first_rank", &PlanMicroBatch::first_rank)
      .def_readonly("num_ranks", &PlanMicroBatch::num_ranks)
      .def_readonly("rank_tokens", &PlanMicroBatch::rank_tokens)
      .def_readonly("rank_flops", &PlanMicroBatch::rank_flops)
      .def_readonly("comm_bytes", &PlanMicroBatch::comm_bytes)
      .def_readonly("start_us", &PlanMicroBatch::start_us)
      .def_readonly("time_us", &PlanMicroBatch::time_us)
      .def_readonly("rollbacks", &PlanMicroBatch::rollbacks)
      .def_readonly("moves", &PlanMicroBatch::moves);

  py::class_<Plan>(m, "Plan")
      .def_readonly("lengths", &Plan::lengths)
      .def_readonly("micro_batch", &Plan::micro_batch)
      .def_readonly("first_rank", &Plan::first_rank)
      .def_readonly("num_ranks", &Plan::num_ranks)
      .def_readonly("micro_batches", &Plan::micro_batches)
      .def_readonly("slots", &Plan::slots)
      .def_readonly("group_time_us", &Plan::group_time_us)
      .def_readonly("makespan_us", &Plan::makespan_us)
      .def_readonly("dropped", &Plan::dropped)
      .def_readonly("truncated", &Plan::truncated)
      .def_readonly("chunked_us", &Plan::chunked_us)
      .def_readonly("chunked_group", &Plan::chunked_group)
      .def_readonly("chunked_chunks", &Plan::chunked_chunks)
      .def_readonly("chunked_pad_us", &Plan::chunked_pad_us)
      .def_readonly("widened", &Plan::widened)
      .def_readonly("narrowed", &Plan::narrowed)
      .def_readonly("skrull_plan", &Plan::skrull_plan)
      .def_readonly("rollbacks", &Plan::rollbacks)
      .def_readonly("moves", &Plan::moves)
      .def_readonly("elapsed_us", &Plan::elapsed_us);

  m.def(
      "schedule_pool",
      [](const skrull_py::Lengths& lengths, CostModel cost, Options opt) {
        py::gil_scoped_release release;
        return schedule_pool(lengths.v, cost, opt);
      },
      py::arg("lengths"), py::arg("cost_model"), py::arg("options"),
      "Plans one global batch over the dp x cp world as one pool (policy 'skrull-pool'): sequences sharded over "
      "the ranks they need, up to bucket_size x dp x cp tokens. Pure function of its inputs.");

  m.def(
      "to_plan",
      [](const Schedule& s, int32_t cp, Timeline timeline, double pad_us, double step_us) {
        validate_group(cp, 1);
        for (const MicroBatch& mb : s.micro_batches)
          if (mb.dacp.rank_tokens.size() != static_cast<size_t>(cp))
            throw std::invalid_argument("to_plan: a micro-batch of the schedule has " +
                                        std::to_string(mb.dacp.rank_tokens.size()) + " CP ranks, cp is " + std::to_string(cp));
        if (!(std::isfinite(pad_us) && pad_us >= 0.0)) throw std::invalid_argument("to_plan: pad_us must be finite and >= 0");
        if (!(std::isfinite(step_us) && step_us >= 0.0)) throw std::invalid_argument("to_plan: step_us must be finite and >= 0");
        return to_plan(s, cp, timeline, pad_us, step_us);
      },
      py::arg("schedule"), py::arg("cp"), py::arg("timeline"), py::arg("pad_us"), py::arg("step_us") = 0.0,
      "Skrull's schedule (per DP rank) as the one plan type: micro-batch j of DP rank i at slot j on group i, "
      "a local sequence on one rank, a distributed one on the whole group; timed on `timeline`.");
  m.def(
      "to_plan",
      [](const Schedule& s, const CostModel& cost, const Options& opt) {
        validate_options(opt);
        for (const MicroBatch& mb : s.micro_batches)
          if (mb.dacp.rank_tokens.size() != static_cast<size_t>(opt.cp))
            throw std::invalid_argument("to_plan: a micro-batch of the schedule has " +
                                        std::to_string(mb.dacp.rank_tokens.size()) + " CP ranks, cp is " +
                                        std::to_string(opt.cp));
        return to_plan(s, opt.cp, opt.timeline, cost.pad_pass_us(), cost.step_fixed_us);
      },
      py::arg("schedule"), py::arg("cost_model"), py::arg("options"),
      "The schedule that schedule(lengths, cost_model, options) returned as the one plan type, as "
      "schedule_pool returns it: cp and the timeline from `options`, a pad pass and the step's fixed cost from "
      "`cost_model`.");

  m.def(
      "schedule",
      [](const skrull_py::Lengths& lengths, CostModel cost, Options opt, const std::vector<double>& chunked_us,
         const std::vector<int32_t>& chunked_chunks, const std::vector<int64_t>& chunked_lengths,
         const std::vector<int64_t>& chunked_last_chunk) {
        py::gil_scoped_release release;
        return schedule(lengths.v, cost, opt,
                        ChunkedDocs{chunked_us, chunked_chunks, chunked_lengths, chunked_last_chunk});
      },
      py::arg("lengths"), py::arg("cost_model"), py::arg("options"), py::arg("chunked_us") = std::vector<double>(),
      py::arg("chunked_chunks") = std::vector<int32_t>(), py::arg("chunked_lengths") = std::vector<int64_t>(),
      py::arg("chunked_last_chunk") = std::vector<int64_t>(),
      "Schedules one global batch (GDS + DACP). chunked_us, chunked_chunks, chunked_lengths, chunked_last_chunk: "
      "the times, chunk passes, lengths and last chunks' tokens of the "
      "step's chunked documents (overlength 'chunk'), each assigned to a DP rank (LPT, longest first, or round "
      "robin where faster) that runs it after its micro-batches, the samples balanced around them; on a lockstep "
      "timeline priced with the pad chunks the ranks run. Pure function of its inputs.");
  m.def(
      "assign_chunked",
      [](const std::vector<double>& chunked_us, int32_t dp) {
        validate_group(dp, 1);
        return assign_chunked(chunked_us, dp);
      },
      py::arg("chunked_us"), py::arg("dp"),
      "Each chunked document's DP rank: LPT over dp ranks by time, longest first (ties by index), each to the "
      "rank with the least so far (ties to the lower): what schedule() assigns.");
  m.def(
      "lockstep_passes",
      [](const std::vector<int32_t>& chunked_chunks, const std::vector<int32_t>& groups, int32_t dp) {
        check_lockstep(chunked_chunks, groups, dp);
        return lockstep_passes(chunked_chunks, groups, dp);
      },
      py::arg("chunked_chunks"), py::arg("groups"), py::arg("dp"),
      "Lockstep DP ranks' chunk passes per position k: the most chunks any rank's k-th chunked document takes "
      "(groups: each document's DP rank, in the documents' order).");
  m.def(
      "lockstep_pads",
      [](const std::vector<int32_t>& chunked_chunks, const std::vector<int32_t>& groups, int32_t dp) {
        check_lockstep(chunked_chunks, groups, dp);
        return lockstep_pads(chunked_chunks, groups, dp);
      },
      py::arg("chunked_chunks"), py::arg("groups"), py::arg("dp"),
      "Per DP rank: the pad chunks it runs under lockstep, every position's passes summed less its own chunks.");
  m.def(
      "lockstep_pad_us",
      [](const std::vector<int64_t>& chunked_lengths, const std::vector<int32_t>& chunked_chunks,
         const std::vector<int64_t>& chunked_last_chunk, const std::vector<int32_t>& groups, int32_t dp, int32_t cp,
         const CostModel& cost) {
        validate_group(dp, 1);
        validate_group(cp, 1);
        cost.validate();
        const ChunkedDocs docs{std::vector<double>(chunked_lengths.size(), 0.0), chunked_chunks, chunked_lengths,
                               chunked_last_chunk};
        validate_chunked(docs);
        validate_chunked_ranks(groups, docs.size(), dp);
        return lockstep_pad_us(docs, groups, dp, cp, cost);
      },
      py::arg("chunked_lengths"), py::arg("chunked_chunks"), py::arg("chunked_last_chunk"), py::arg("groups"),
      py::arg("dp"), py::arg("cp"), py::arg("cost_model"),
      "Per DP rank: what its pads add under lockstep at dp > 1: its documents padded to each position's passes "
      "from their padded length, all-pad documents from 0 (CostModel.pad_chunks_us), and a padded document's "
      "last chunk recomputed; zeros at dp 1.");
  m.def(
      "chunked_after",
      [](const std::vector<double>& chunked_us, const std::vector<int32_t>& groups, int32_t dp, Timeline timeline,
         const std::vector<double>& pad_us) {
        validate_group(dp, 1);
        validate_chunked(chunked_us);
        validate_chunked_ranks(groups, chunked_us.size(), dp);
        check_after(pad_us, dp);
        return chunked_after(chunked_us, groups, dp, timeline,
                             pad_us.empty() ? std::vector<double>(dp, 0.0) : pad_us);
      },
      py::arg("chunked_us"), py::arg("groups"), py::arg("dp"), py::arg("timeline"), py::arg("pad_us"),
      "Per DP rank: the work it runs after its micro-batches, its chunked documents' times and, on a lockstep "
      "timeline at dp > 1, its pad chunks' price pad_us[rank] (lockstep_pad_us; [] for none).");

  py::class_<Lookahead>(m, "Lookahead")
      .def_readonly("offsets", &Lookahead::offsets)
      .def_readonly("step", &Lookahead::step)
      .def_property_readonly("steps", &Lookahead::steps, "per step: its samples, ascending (arrival order), from step")
      .def_readonly("step_us", &Lookahead::step_us)
      .def_readonly("arrival_us", &Lookahead::arrival_us)
      .def_readonly("window_us", &Lookahead::window_us)
      .def_readonly("arrival_window_us", &Lookahead::arrival_window_us)
      .def_readonly("moved", &Lookahead::moved)
      .def_readonly("max_delay", &Lookahead::max_delay)
      .def_readonly("long_fraction", &Lookahead::long_fraction)
      .def_readonly("long_steps", &Lookahead::long_steps)
      .def_readonly("candidates", &Lookahead::candidates)
      .def_readonly("screened", &Lookahead::screened)
      .def_readonly("swaps", &Lookahead::swaps)
      .def_readonly("swap_trials", &Lookahead::swap_trials)
      .def_readonly("swap_visits", &Lookahead::swap_visits)
      .def_readonly("planned", &Lookahead::planned)
      .def_readonly("elapsed_us", &Lookahead::elapsed_us)
      .def("__repr__", [](const Lookahead& a) {
        std::ostringstream os;
        os << "Lookahead(steps=" << a.step_us.size() << ", moved=" << a.moved << ", max_delay=" << a.max_delay
           << ", window_us=" << a.window_us << ", arrival_window_us=" << a.arrival_window_us << ")";
        return os.str();
      });

  m.def(
      "lookahead",
      [](const std::vector<std::vector<int64_t>>& batches, CostModel cost, Options opt, bool pool,
         const std::vector<std::vector<double>>& chunked, const std::vector<std::vector<int32_t>>& chunked_chunks,
         const std::vector<std::vector<int64_t>>& chunked_lengths,
         const std::vector<std::vector<int64_t>>& chunked_last_chunk) {
        validate_options(opt);
        if (chunked_chunks.size() != chunked.size() || chunked_lengths.size() != chunked.size() ||
            chunked_last_chunk.size() != chunked.size())
          throw std::invalid_argument("lookahead window: " + std::to_string(chunked_chunks.size()) +
                                      " lists of chunk counts, " + std::to_string(chunked_lengths.size()) +
                                      " of lengths and " + std::to_string(chunked_last_chunk.size()) +
                                      " of last chunks for " + std::to_string(chunked.size()) +
                                      " lists of chunked documents");
        std::vector<ChunkedDocs> docs(chunked.size());
        for (size_t b = 0; b < chunked.size(); ++b) docs[b] = {chunked[b], chunked_chunks[b], chunked_lengths[b], chunked_last_chunk[b]};
        py::gil_scoped_release release;
        if (pool)  // the pool's plans run a step's chunked documents after its micro-batches, LPT over the groups
          return lookahead(batches, std::move(docs), cost, opt, [&](const std::vector<int64_t>& l, const ChunkedDocs& c) {
            Plan p = schedule_pool(l, cost, opt);
            p.chunked_us = c.us;
            p.chunked_chunks = c.chunks;
            p.chunked_group = assign_chunked(c.us, opt.dp);
            p.chunked_pad_us = lockstep_pad_us(c, p.chunked_group, opt.dp, opt.cp, cost);
            detail::retime_plan(p, opt.timeline, cost.pad_pass_us(), cost.step_fixed_us);
            return p.makespan_us;
          });
        return lookahead(batches, std::move(docs), cost, opt, [&](const std::vector<int64_t>& l, const ChunkedDocs& c) {
          return schedule(l, cost, opt, c).makespan_us;
        });
      },
      py::arg("batches"), py::arg("cost_model"), py::arg("options"), py::arg("pool") = false,
      py::arg("chunked") = std::vector<std::vector<double>>(),
      py::arg("chunked_chunks") = std::vector<std::vector<int32_t>>(),
      py::arg("chunked_lengths") = std::vector<std::vector<int64_t>>(),
      py::arg("chunked_last_chunk") = std::vector<std::vector<int64_t>>(),
      "Regroups a window of W global batches (lengths in arrival order) over its W steps: each step keeps its "
      "sample count, every sample moves at most W-1 steps. Candidates are screened by an estimate of a step's "
      "time (options' DP, CP and BucketSize); a few are planned in full (each step by schedule(), or "
      "schedule_pool() with pool=True) and the least summed predicted time wins, arrival order unless a "
      "grouping predicts faster. chunked, chunked_chunks, chunked_lengths, chunked_last_chunk (one list per "
      "batch, or none): each batch's chunked documents' times, chunk passes, lengths and last chunks, which stay at their step and are priced with it. Budgets count operations: a pure function of its inputs.");

  m.def(
      "dacp",
      [](const std::vector<int64_t>& lengths, CostModel cost, int32_t cp, int64_t bucket_size,
         Placement placement, Rollback rollback, bool refine) {
        py::gil_scoped_release release;
        return dacp(lengths, cost, cp, bucket_size, placement, rollback, refine);
      },
      py::arg("lengths"), py::arg("cost_model"), py::arg("cp"), py::arg("bucket_size"),
      py::arg("placement") = Placement::kLeastLoad, py::arg("rollback") = Rollback::kLongest,
      py::arg("refine") = false,
      "DACP placement of one micro-batch; status UNSCHEDULABLE when memory cannot hold it.");

  m.def(
      "dacp_sweep",
      [](const std::vector<int64_t>& lengths, CostModel cost, int32_t cp, int64_t bucket_size) {
        py::gil_scoped_release release;
        return dacp_sweep(lengths, cost, cp, bucket_size);
      },
      py::arg("lengths"), py::arg("cost_model"), py::arg("cp"), py::arg("bucket_size"),
      "DACP by sweeping how many of the longest sequences to shard; fastest predicted placement.");

  m.def(
      "dacp_for",
      [](const std::vector<int64_t>& lengths, CostModel cost, Options opt) {
        py::gil_scoped_release release;
        return dacp_for(lengths, cost, opt);
      },
      py::arg("lengths"), py::arg("cost_model"), py::arg("options"),
      "The placement GDS would choose for one micro-batch under these options (Algorithm 1/4, refinement, "
      "shard sweep).");

  m.def(
      "evaluate_placement",
      [](const std::vector<int64_t>& lengths, const std::vector<int32_t>& cp_rank, const CostModel& cost, int32_t cp,
         int64_t bucket_size) {
        return evaluate_placement(lengths, cp_rank, cost, cp, bucket_size);
      },
      py::arg("lengths"), py::arg("cp_rank"), py::arg("cost_model"), py::arg("cp"), py::arg("bucket_size"),
      "Scores a given placement with the cost model; UNSCHEDULABLE if a rank exceeds bucket_size.");

  m.def(
      "step_time_us",
      [](const std::vector<std::vector<double>>& rank_us, Timeline timeline, double pad_us, double step_us,
         const std::vector<double>& after_us) {
        for (const auto& rank : rank_us)
          for (double t : rank)
            if (!(t >= 0.0 && t < 1e300)) throw std::invalid_argument("micro-batch times must be finite and >= 0");
        if (!(pad_us >= 0.0 && pad_us < 1e300)) throw std::invalid_argument("pad_us must be finite and >= 0");
        if (!(step_us >= 0.0 && step_us < 1e300)) throw std::invalid_argument("step_us must be finite and >= 0");
        check_after(after_us, static_cast<int32_t>(rank_us.size()));
        return step_time_us(rank_us, timeline, pad_us, step_us, after_us.empty() ? nullptr : &after_us);
      },
      py::arg("rank_us"), py::arg("timeline"), py::arg("pad_us"), py::arg("step_us") = 0.0,
      py::arg("after_us") = std::vector<double>(),
      "Step time of per-DP-rank micro-batch times (rank_us[i][j]: rank i's slot j) on a timeline: lockstep, the "
      "sum over slots of the slowest rank (pad_us where a rank has no micro-batch); free-running, the slowest "
      "rank's sum. after_us (per rank, or none): work after its micro-batches (chunked documents): added to its "
      "sum free-running, its largest after the slots lockstep.");

  py::class_<SlotTime>(m, "SlotTime")
      .def(py::init([](int32_t slot, int32_t first_group, int32_t groups, double time_us) {
             return SlotTime{slot, first_group, groups, time_us};
           }),
           py::arg("slot"), py::arg("first_group"), py::arg("groups"), py::arg("time_us"));
  m.def(
      "plan_step_time_us",
      [](const std::vector<SlotTime>& mbs, int32_t dp, Timeline timeline, double pad_us, double step_us,
         const std::vector<double>& after_us) {
        check_slot_times(mbs, dp);
        if (!(std::isfinite(step_us) && step_us >= 0.0)) throw std::invalid_argument("step_us must be finite and >= 0");
        check_after(after_us, dp);
        return plan_step_time_us(mbs, dp, timeline, pad_us, nullptr, nullptr, step_us,
                                 after_us.empty() ? nullptr : &after_us);
      },
      py::arg("micro_batches"), py::arg("dp"), py::arg("timeline"), py::arg("pad_us"), py::arg("step_us") = 0.0,
      py::arg("after_us") = std::vector<double>(),
      "Step time of a plan's micro-batches (slot, first_group, groups, time_us) over dp CP groups.");
  m.def(
      "plan_timeline",
      [](const std::vector<SlotTime>& mbs, int32_t dp, Timeline timeline, double pad_us, double step_us,
         const std::vector<double>& after_us) {
        check_slot_times(mbs, dp);
        if (!(std::isfinite(step_us) && step_us >= 0.0)) throw std::invalid_argument("step_us must be finite and >= 0");
        check_after(after_us, dp);
        std::vector<double> group_free_us, start_us;
        const double step = plan_step_time_us(mbs, dp, timeline, pad_us, &group_free_us, &start_us, step_us,
                                              after_us.empty() ? nullptr : &after_us);
        return py::make_tuple(step, group_free_us, start_us);
      },
      py::arg("micro_batches"), py::arg("dp"), py::arg("timeline"), py::arg("pad_us"), py::arg("step_us") = 0.0,
      py::arg("after_us") = std::vector<double>(),
      "plan_step_time_us with what it replays: (step_us, each group's free-running finish, each micro-batch's "
      "start on the timeline).");

  m.def(
      "shard_tokens",
      [](int64_t length, int32_t cp) {
        validate_lengths({length}, "shard_tokens");
        validate_group(cp, 1);
        return shard_tokens(length, cp);
      },
      py::arg("length"), py::arg("cp"),
        "Tokens one CP rank holds of a sequence sharded (zigzag, padded to 2*cp) over cp ranks.");
  m.def(
      "max_sequence_length",
      [](int64_t bucket_size, int64_t ranks) {
        detail::check_in("ranks", ranks, int64_t{1}, int64_t{kMaxRanks} * kMaxRanks);
        detail::check_in("bucket_size", bucket_size, int64_t{1}, kMaxBucketSize);
        return max_sequence_length(bucket_size, ranks);
      },
      py::arg("bucket_size"), py::arg("ranks"),
        "Longest sequence `ranks` ranks (a CP group, or the dp x cp world of the pool) can hold.");

#ifdef VERSION_INFO
  m.attr("__version__") = MACRO_STRINGIFY(VERSION_INFO);
#else
  m.attr("__version__") = "dev";
#endif
}
