"""Skrull under tensor parallelism: the cost model prices one TP rank's share
(FLOPs and exchanged K/V bytes divided by TP, exact numbers), the job's TP
degree reaches the scheduler's cost model, and what Skrull refuses (pipeline
parallelism, with its reason; TP with skrull-pool or another SPMD backend)
fails at config time in one line naming the key."""

import os
from types import SimpleNamespace

import pytest

from skrull_ext._core import CommModel, CostModel, ModelShape
from skrull_ext.errors import JobFileError
from skrull_ext.scheduler.model_shape import job_shape
from skrull_ext.train.job.job_checks import check_job
from skrull_ext.train.job.job_file import load_config, load_job
from skrull_ext.train.job.tensor_parallel import PP_REASON, check_skrull_parallelism, pp_refusal

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEBUG = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu.toml")
PROFILE = os.path.join(ROOT, "profiles", "cpu-debug-gloo2.toml")  # measured on llama3/debugmodel at TP 1


def _cost(tp: int) -> CostModel:
    """2 layers, h = 256, h_kv = 64, float32; 1e-6 us per FLOP + 10 us per call; a
    flat 50 us per collective above 1000 bytes (5 us below), 2 per layer."""
    return CostModel(shape=ModelShape(2, 256, 64, 4, tp=tp), a_us_per_flop=1e-6, b_us=10.0,
                     comm=CommModel(bytes=[1000.0], us=[50.0], threshold_bytes=1000.0, floor_us=5.0))


def test_flops_and_kv_bytes_are_one_tp_ranks_share():
    one, two, four = _cost(1), _cost(2), _cost(4)
    # 20 h^2 s + 4 h h_kv s + 4 h s^2 at s = 100: 131,072,000 + 6,553,600 + 10,240,000
    assert one.flops(100) == 147_865_600.0
    assert two.flops(100) == 73_932_800.0
    assert four.flops(100) == 36_966_400.0
    # K and V: 2 x 100 tokens x 64 x 4 bytes = 51,200; each TP rank holds and sends its heads' share
    assert (one.kv_bytes(100), two.kv_bytes(100), four.kv_bytes(100)) == (51_200.0, 25_600.0, 12_800.0)


def test_micro_batch_time_at_tp2():
    c = _cost(2)
    # Rank 0 holds a local 100-token sequence, rank 1 none; one 400-token sequence is
    # distributed over CP 2: rank share flops(400) / 2, its K/V 2 x 400 x 64 x 4 / 2 = 102,400 bytes.
    local = [c.flops(100), 0.0]
    dist = c.flops(400) / 2
    # (524,288,000 + 26,214,400 + 163,840,000) / TP 2 / CP 2
    assert dist == 178_585_600.0
    comm = c.kv_bytes(400)
    assert comm == 102_400.0
    # per layer: max(2 x 50 us of exchange, 1e-6 x 73,932,800 + 10) + (1e-6 x 178,585,600 + 10): the
    # halved local compute now hides under the exchange
    assert c.micro_batch_us(local, dist, comm) == pytest.approx(2 * (100.0 + 188.5856), rel=1e-12)
    one = _cost(1)  # at TP 1 the local compute (157.8656 us) exceeds the exchange
    assert one.micro_batch_us([one.flops(100), 0.0], one.flops(400) / 2, one.kv_bytes(400)) == pytest.approx(
        2 * ((147.8656 + 10.0) + (357.1712 + 10.0)), rel=1e-12)


def test_shape_carries_tp_and_rejects_a_bad_one():
    s = ModelShape(2, 256, 64, 4, tp=2)
    assert s.tp == 2 and repr(s) == "ModelShape(layers=2, hidden=256, kv_width=64, bytes_per_elem=4, tp=2)"
    assert ModelShape(2, 256, 64).tp == 1 and "tp" not in repr(ModelShape(2, 256, 64))
    with pytest.raises(ValueError, match=r"cost model: tp must be in \[1, 1024\], got 0"):
        _cost(0)


def test_the_jobs_tp_degree_reaches_the_schedulers_cost_model(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    config = load_config(["--config-file", DEBUG, "--parallelism.tensor_parallel_degree", "2",
                          "--parallelism.context_parallel_degree", "2", "--skrull.cost_model", PROFILE])
    shape = job_shape(config)
    assert (shape.layers, shape.hidden, shape.kv_width, shape.bytes_per_elem, shape.tp) == (6, 256, 256, 4, 2)
    # The measured profile's [model] (no TP: a model's shape) accepts the job, and prices a TP rank's share.
    cost = config.skrull.build(1, 2, shape, lookahead=1).cost_model
    full = load_config(["--config-file", DEBUG, "--skrull.cost_model", PROFILE]).skrull.build(1, 1, job_shape(
        load_config(["--config-file", DEBUG])), lookahead=1).cost_model
    assert cost.shape.tp == 2 and full.shape.tp == 1
    assert cost.flops(300) == full.flops(300) / 2 and cost.kv_bytes(300) == full.kv_bytes(300) / 2


def test_pipeline_parallelism_is_refused_with_its_reason(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    # (torchtitan's own check, that CUDA graphs cannot run PP, comes first without the flag)
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", DEBUG, "--training.disable_cuda_graphs",
                     "--parallelism.pipeline_parallel_degree", "2"])
    text = str(info.value)
    assert text.endswith(pp_refusal(2)) and "\n" not in text
    assert pp_refusal(2) == ("parallelism.pipeline_parallel_degree = 2: skrull.enable does not run with pipeline "
                             f"parallelism: {PP_REASON}")
    assert "its own DacpBatchMeta" in PP_REASON and "fixed-shape local batch" in PP_REASON
    # The job checks refuse it too (a config whose degree was set after its sections' own checks).
    config = load_job(DEBUG)
    with pytest.raises(JobFileError) as info:
        check_skrull_parallelism(SimpleNamespace(skrull=config.skrull, parallelism=SimpleNamespace(
            pipeline_parallel_degree=4, tensor_parallel_degree=1)), on_cpu=True)
    assert str(info.value) == pp_refusal(4)
    # torchtitan's own batching (skrull.enable false) is torchtitan's to judge.
    config = load_config(["--config-file", DEBUG, "--training.disable_cuda_graphs", "--skrull.no-enable",
                          "--parallelism.pipeline_parallel_degree", "2"])
    assert config.parallelism.pipeline_parallel_degree == 2


def test_tp_with_the_pool_policy_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(JobFileError, match=r"^skrull.policy = 'skrull-pool': skrull-pool does not run with "
                                           r"parallelism.tensor_parallel_degree = 2 \(its K/V exchange sets name "
                                           r"world ranks"):
        load_config(["--config-file", DEBUG, "--parallelism.tensor_parallel_degree", "2",
                     "--parallelism.context_parallel_degree", "2", "--skrull.policy", "skrull-pool"])


def test_tp_on_a_gpu_needs_the_partial_dtensor_backend():
    config = load_job(DEBUG)
    config.parallelism.tensor_parallel_degree = 2
    config.parallelism.context_parallel_degree = 2
    check_job(config, world_size=4, on_cpu=True)  # torchtitan_patches sets partial_dtensor on CPU
    assert config.parallelism.spmd_backend == "spmd_types"  # torchtitan 0.3.0's default
    with pytest.raises(JobFileError, match=r"^parallelism.spmd_backend = 'spmd_types': Skrull with "
                                           r"tensor_parallel_degree 2 runs under 'partial_dtensor' only"):
        check_job(config, world_size=4, on_cpu=False)
    config.parallelism.spmd_backend = "partial_dtensor"
    check_job(config, world_size=4, on_cpu=False)
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.spmd_backend = "spmd_types"
    check_job(config, world_size=2, on_cpu=False)  # no TP: as before


def test_the_core_plans_a_tp_job_as_the_python_reference():
    """The plan the core makes at TP 4 (its FLOPs and K/V bytes a quarter) equals the Python
    reference's operation for operation, and differs from the TP 1 plan of the same batch."""
    from skrull_ext import POLICIES, Scheduler, SchedulerConfig, _core
    from skrull_ext.bench import reference as ref
    from skrull_ext.scheduler import cost_model as cm

    s = cm.shape("qwen2.5-7b")
    tp4 = cm.hardware("h100-assumed").cost_model(ModelShape(s.layers, s.hidden, s.kv_width, s.bytes_per_elem, tp=4))
    lengths = [300, 12_000, 800, 26_000, 5_000, 40_000, 2_000, 150, 9_000, 700, 18_000, 64]
    config = SchedulerConfig(dp=2, cp=4, bucket_size=16_384, policy="skrull", cpsat=False, timeline="free")
    plan = Scheduler(config, tp4).schedule(lengths)
    p = POLICIES["skrull"]
    want = ref.schedule(lengths, ref.RefCost.of(tp4), 2, 4, 16_384,
                        worst_fit=p.placement == _core.Placement.WORST_FIT,
                        longest_rollback=p.rollback == _core.Rollback.LONGEST,
                        predicted_time=p.micro_batch_count == _core.MicroBatchCount.PREDICTED_TIME,
                        refine_=p.refine, sweep=p.dacp_search == _core.DacpSearch.SHARD_SWEEP, free_running=True)
    assert ref.RefCost.of(tp4).tp == 4
    assert (plan.dp_rank, plan.slot, plan.cp_rank) == (want.dp_rank, want.micro_batch, want.cp_rank)
    assert plan.group_time_us == want.dp_time_us
    tp1 = Scheduler(config, cm.hardware("h100-assumed").cost_model(s)).schedule(lengths)
    assert tp1.group_time_us != plan.group_time_us
