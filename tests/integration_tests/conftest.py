"""Shared integration fixtures: one seed checkpoint and one torchtitan
1-process reference run per session, which every parity test compares with.

Each launch trains for seconds even with its ranks forked from a warm
process (forked.py), so runs are built once, on first use, and shared
between the checks that read them.
"""

import os

import pytest

from tests.integration_tests.launch import REPO, Run, seed_checkpoint, train_from_seed

TORCHTITAN = ["--module", "skrull_ext.train", "--config", "llama3_debugmodel_cpu"]
PLAN_PROFILE = os.path.join(REPO, "tests", "integration_tests", "cpu-debug-gloo2-2026-11-22.toml")
"""The cost model the parity runs plan with: the debug job's CPU profile as measured on
2026-11-22 (no fixed cost of a micro-batch), frozen here so that the plan shapes the tests
rest on (CHECK_STEP mixes local and distributed sequences, POOL_SUB_STEP gives the DP ranks
unequal counts, CP-SAT replaces placements) do not move when profiles/cpu-debug-gloo2.toml is
re-measured. Runs that name their own cost model (dp1cp4_pool) override it."""
SKRULL = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml"),
          "--skrull.cost_model", PLAN_PROFILE, "--skrull.lookahead", "1"]
"""The parity runs' flags. Look-ahead off: a parity run compares each step with the reference's
step of the same samples, which a window (the default "auto" may choose one) regroups; the
look-ahead runs (test_lookahead_resume.py, test_exactly_once_run.py) name their width after these."""
STEPS = 5
CHECK_STEP = 4
"""The step whose gradients are compared: on the debug data, skrull and
worstfit schedule it differently at CP=2, and both place some sequences
local and some distributed."""
POOL_SUB_STEP = 2
"""The step of the dp1cp4_pool run with a 2-rank sharded sequence beside 4-rank
ones; the reference saves its gradients too (test_parity_pool.py), and the last
step of the SHORT runs. Also the step where the dp2cp2_free run's DP ranks run
unequal micro-batch counts (test_free_running.py); cp2 saves its gradients too, which
the worstfit-scheduled SHORT run is compared with (test_parity_skrull.py)."""


SHORT = frozenset({"cp2_segments_ac_full", "cp2_tiles_ac_selective", "tp2cp2", "dp2tp2",
                   "cp2_head_chunks", "cp2_bf16", "dp2cp2_bf16", "dp2cp2_pool",
                   "dp1cp4_pool", "dp2rep_defer"})
"""Runs that train POOL_SUB_STEP steps instead of STEPS, their gradients saved at the last and
compared with the reference's of that step (its ``step_grads``): their tests need one step that
mixes local and distributed sequences after an optimizer step, and step 2 of the debug data does at
CP 2 (and under TP 2 x CP 2's plan). test_parity_skrull.py, test_parity_tp.py,
test_head_loss_run.py, test_bf16_parity.py and test_parity_pool.py read them (the pool runs: step 2
shards sequences over all 4 ranks, and over a sub-group at DP 1 x CP 4)."""


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("integration"))


@pytest.fixture(scope="session")
def seed(workdir) -> str:
    return seed_checkpoint(workdir, TORCHTITAN)


@pytest.fixture(scope="session")
def reference(workdir, seed) -> Run:
    """torchtitan's own Trainer, 1 process, rows packed as torchtitan does."""
    run = train_from_seed(workdir, "ref", 1, "torchtitan.train", TORCHTITAN, seed, STEPS, grads_at=CHECK_STEP,
                          more_grads_at=(POOL_SUB_STEP,))
    ref = run.losses
    assert len(ref) == STEPS and ref[-1] < ref[0], f"reference loss did not decrease: {ref}"
    return run


class SkrullRuns:
    """Skrull runs from the seed, launched on first use and kept for the session."""

    SHAPES = {
        "cp2": (2, ["--parallelism.context_parallel_degree", "2"]),
        # Lockstep (free_running off: the default "auto" runs these jobs free-running), and
        # gradients reduce-scattered once per step (cp2 runs free-running, the default).
        # The head and loss in chunks of 48 tokens too, their gradients computed in forward (the
        # "auto" choice here: train/head_grad.py; test_head_loss_run.py checks them), the runs of this
        # shape without (dp2cp2_pool, dp2cp2_bf16) holding the head whole. Under torchtitan's full AC
        # (FSDP's all-gathers re-issued in the recomputation, the DACP exchange replayed:
        # test_parity_skrull.py), one run instead of a second 4-rank one for AC: FSDP at DP 2 x CP 2
        # without AC trains in dp2cp2_free, dp2cp2_pool and dp2cp2_bf16.
        "dp2cp2": (4, ["--parallelism.context_parallel_degree", "2",
                       "--parallelism.data_parallel_shard_degree", "2", "--skrull.defer_grad_sync",
                       "--skrull.no-free_running", "--loss.chunk_tokens", "48", "--activation_checkpoint.kind",
                       "full", "--skrull.activation_checkpoint", "job"]),
        # The CP-SAT fallback forced on every micro-batch (margin 0): each CP rank solves the same
        # micro-batches in its own process. Under skrull-fast (no shard sweep) CP-SAT replaces the
        # heuristic's placements at steps 1 and 4 of the debug data; under skrull at none.
        "cp2_cpsat": (2, ["--parallelism.context_parallel_degree", "2", "--skrull.policy", "skrull-fast",
                          "--skrull.cpsat", "--skrull.cpsat_margin", "0"]),
        # DACP's two parts on the varlen segment plan (its CPU reference executor), not dense masks,
        # and the same plan in query tiles (kernels.py, tiles.py); each run also under one of
        # torchtitan's activation checkpointing kinds around blocks that hold the DACP attention (the
        # kind forced: the debug job's "auto" would choose among the modes of a profile that measured
        # them): the K/V replay (replay.py) keeps what a kernel is handed, whichever kernel; one run
        # each instead of four (test_parity_skrull.py checks the kernel and the AC of each). The tiles
        # run also schedules with the 'worstfit' policy: its step 2 is planned otherwise than cp2's
        # (skrull), which saves that step's gradients too (test_parity_skrull.py's schedule invariance),
        # rather than a run of its own whose start-up costs as much as its steps.
        "cp2_segments_ac_full": (2, ["--parallelism.context_parallel_degree", "2", "--skrull.attention_kernel",
                                     "segments", "--activation_checkpoint.kind", "full",
                                     "--skrull.activation_checkpoint", "job"]),
        "cp2_tiles_ac_selective": (2, ["--parallelism.context_parallel_degree", "2", "--skrull.attention_kernel",
                                       "tiles", "--activation_checkpoint.kind", "selective",
                                       "--skrull.activation_checkpoint", "job", "--skrull.policy", "worstfit"]),
        # One pool over DP 2 x CP 2 (issue 18): bucket_size 128, so the debug data's sequences of
        # 257..512 tokens (over C x CP = 256) are sharded over all 4 ranks, across both DP groups.
        "dp2cp2_pool": (4, ["--parallelism.context_parallel_degree", "2",
                            "--parallelism.data_parallel_shard_degree", "2", "--skrull.policy", "skrull-pool",
                            "--skrull.bucket_size", "128", "--skrull.overlength", "error"]),
        # One pool at DP 1 x CP 4 with sub-group sets: priced on the h100-assumed preset (the tiny
        # model's compute is cheap there, so its K/V exchange matters) and bucket_size 472, the
        # planner puts step 2's 335-token sequence on ranks 2-3 beside the 390 and 512 on all 4
        # (the measured CPU profile prices compute so high that narrowing never pays on this data).
        "dp1cp4_pool": (4, ["--parallelism.context_parallel_degree", "4", "--skrull.policy", "skrull-pool",
                            "--skrull.bucket_size", "472", "--skrull.cost_model", "h100-assumed",
                            "--skrull.overlength", "error"]),
        # Free-running (issue 23): FSDP parameters unsharded for each step, each DP rank running
        # only its own micro-batches. skrull-paper's strided groups give the DP ranks unequal
        # counts at step 2 (4 and 2); skrull's LPT groups pack both ranks' shares of this data
        # into equal counts (2 and 2) in every one of the 5 steps.
        "dp2cp2_free": (4, ["--parallelism.context_parallel_degree", "2",
                            "--parallelism.data_parallel_shard_degree", "2", "--skrull.free_running",
                            "--skrull.policy", "skrull-paper"]),
        # Replicate-only DP with the gradient sync deferred (no FSDP shard over DP ranks, the one
        # all-reduce in each rank's last backward): the free-running timeline without holding
        # anything unsharded (config.job_timeline), each DP rank running its own micro-batches.
        # CP 1, so bucket_size 512 holds the debug data's longest; skrull-paper's strided groups
        # give the DP ranks unequal counts at step 2 (test_free_running.py).
        "dp2rep_defer": (2, ["--parallelism.data_parallel_replicate_degree", "2",
                             "--parallelism.data_parallel_shard_degree", "1", "--skrull.defer_grad_sync",
                             "--skrull.no-free_running", "--skrull.bucket_size", "512",
                             "--skrull.policy", "skrull-paper"]),
        # torchtitan's per-block torch.compile (fullgraph) around the DACP custom op
        # (attention/compiled.py) under full AC, its head and loss in chunks of 48 tokens (their
        # gradients computed in forward, "auto": train/head_grad.py; the loss compiled per chunk),
        # traced by aot_eager as every compiled run here (test_compile.py: the same dynamo graphs and
        # AOT autograd's recompute partition; inductor's C++ code around the op, for the traced
        # all-local attention and the in-forward head chunk: tests/unit_tests/test_inductor_cpu.py).
        # One run for the three compiled checks (against eager cp2, the chunked head, the replayed
        # exchange under AC): two runs, one with AC and one with the chunks, cost a compile each.
        "cp2_compile_ac_full_head_chunks": (2, ["--parallelism.context_parallel_degree", "2", "--compile.enable",
                                                "--compile.backend", "aot_eager", "--activation_checkpoint.kind",
                                                "full", "--skrull.activation_checkpoint", "job",
                                                "--loss.chunk_tokens", "48"]),
        # torchtitan's tensor parallelism (its llama3 plan: heads and MLP columns split, sequence
        # parallel norms, vocab-sharded logits) under DACP, with CP and with FSDP (test_parity_tp.py).
        # TP 2 x CP 2 computes its head and loss in chunks of 48 tokens (vocab-sharded logits: "auto"
        # recomputes them, test_parity_tp.py's head-chunk test); DP 2 x TP 2 holds the head whole.
        "tp2cp2": (4, ["--parallelism.context_parallel_degree", "2", "--parallelism.tensor_parallel_degree", "2",
                       "--loss.chunk_tokens", "48"]),
        # Without CP a rank holds every sequence whole: bucket_size 512, the debug data's longest.
        "dp2tp2": (4, ["--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree", "2",
                       "--skrull.defer_grad_sync", "--skrull.bucket_size", "512"]),
        # FSDP's bf16 parameters, the GPU jobs' setting (test_bf16_parity.py). The frozen CPU profile
        # is float32-shaped (a profile prices one dtype), so these plan with the h100-assumed preset,
        # which takes its shape from the job.
        "cp2_bf16": (2, ["--parallelism.context_parallel_degree", "2",
                         "--training.mixed_precision_param", "bfloat16", "--skrull.cost_model", "h100-assumed"]),
        # The head and loss in chunks of 48 tokens (train/head_loss.py; the debug job's default
        # chunk holds a whole micro-batch), at CP 2 free-running with the chunks recomputed
        # (loss.head_backward "recompute"), and with their gradients computed in forward ("auto":
        # train/head_grad.py) at CP 2 with compiled blocks and loss under full AC
        # (cp2_compile_ac_full_head_chunks above: the suite's compiled Skrull run); dp2cp2 and tp2cp2
        # above chunk theirs too (test_head_loss_run.py, test_parity_tp.py; the compiled run's checks:
        # test_compile.py).
        "cp2_head_chunks": (2, ["--parallelism.context_parallel_degree", "2", "--loss.chunk_tokens", "48",
                                "--loss.head_backward", "recompute"]),
        "dp2cp2_bf16": (4, ["--parallelism.context_parallel_degree", "2",
                            "--parallelism.data_parallel_shard_degree", "2", "--skrull.defer_grad_sync",
                            "--training.mixed_precision_param", "bfloat16", "--skrull.cost_model", "h100-assumed"]),
    }

    def __init__(self, workdir: str, seed: str):
        self.workdir, self.seed, self.runs = workdir, seed, {}

    def __getitem__(self, name: str) -> Run:
        if name not in self.runs:
            nproc, extra = self.SHAPES[name]
            steps, check = (POOL_SUB_STEP, POOL_SUB_STEP) if name in SHORT else (STEPS, CHECK_STEP)
            self.runs[name] = train_from_seed(
                self.workdir, name, nproc, "skrull_ext.train", SKRULL, self.seed, steps,
                extra=["--skrull.plan_log", *extra], grads_at=check,
                save_every=2 if name == "cp2" else None,  # cp2's step-4 checkpoint feeds test_resume (5 steps, saved every 2)
                more_grads_at=(POOL_SUB_STEP,) if name in ("dp2cp2_free", "cp2") else (),
                env={"SKRULL_PROBE_PASSES": self.passes_folder(name)},
            )
        return self.runs[name]

    def passes_folder(self, name: str) -> str:
        """Where run ``name``'s ranks count their forward passes per step (probe.py)."""
        return os.path.join(self.workdir, f"{name}.passes")


@pytest.fixture(scope="session")
def skrull_runs(workdir, seed) -> SkrullRuns:
    return SkrullRuns(workdir, seed)
