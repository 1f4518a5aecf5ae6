"""``[skrull] free_running`` (issue 23, item 3): its dataloader, config and memory checks,
and the FSDP switches on real gloo processes whose ranks run different micro-batch counts.

The whole-job parity (DP 2 x CP 2, the debug model, against torchtitan's 1-process
reference) is tests/integration_tests/test_free_running.py.
"""

import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from skrull_ext import _core
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.errors import JobFileError
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.scheduler.job import SchedulerJob
from skrull_ext.train.job.skrull_config import SkrullConfig
from tests.unit_tests.gloo_worker import count_calls, gloo_group

ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "skrull_ext" / "jobs" / "debug_cpu.toml")
CPU_PROFILE = str(ROOT / "profiles" / "cpu-debug-gloo2.toml")


# ---------------------------------------------------------------- dataloader


def _grid(dp: int, cp: int, free_running: bool, global_batch: int = 16, bucket: int = 256,
          lockstep_passes: bool = False):
    """Loaders of every (DP, CP) rank; the plans are made for the free-running timeline, whether
    FSDP holds the parameters unsharded (``free_running``) or not (replicate-only DP under
    ``defer_grad_sync``: config.job_timeline). ``lockstep_passes``: validation's builder, padded
    to the plan's slots: the same plan, built the lockstep way."""
    section = SkrullConfig(bucket_size=bucket, cost_model="h100-assumed")
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=global_batch,
                                     vocab_size=2048, prefetch_steps=0)
    grid = {}
    for d in range(dp):
        for c in range(cp):
            loader = config.build(dp_world_size=dp, dp_rank=d)
            job = SchedulerJob.of(section, dp=dp, cp=cp, timeline=_core.Timeline.FREE_RUNNING, bucket_size=bucket,
                                  cost_model=cost_model.preset("llama3-debug"), free_running=free_running,
                                  lookahead=1)
            loader.attach(Scheduler(job), c, cp)
            if lockstep_passes:
                loader.builder = replace(loader.builder, lockstep_passes=True)
            grid[d, c] = loader
    return grid


def _steps(grid, n: int):
    return [{key: loader.next_step() for key, loader in grid.items()} for _ in range(n)]


@pytest.mark.parametrize("free_running", [True, False], ids=["fsdp_unsharded", "replicate_deferred"])
def test_free_running_builds_only_the_ranks_own_micro_batches(free_running):
    """On the free-running timeline each rank's step holds its DP rank's own micro-batches, no
    pads, the same buffers as the padded step's first ones, whether the execution holds FSDP's
    parameters unsharded or is replicate-only DP with the gradient sync deferred (whose plans are
    priced free-running too: padding its ranks ran passes no plan priced); validation's builder
    (lockstep passes) pads every rank to the plan's count. Some step of the data gives the DP
    ranks unequal counts."""
    # global batch 12: GDS packs 16 into equal counts on both ranks for 12 steps (LPT groups,
    # scheduler.hpp split_share); 12 gives ranks 1 and 2 at step 10
    free = _steps(_grid(2, 2, free_running, global_batch=12), 10)
    lock = _steps(_grid(2, 2, free_running, global_batch=12, lockstep_passes=True), 10)
    unequal = 0
    for f_step, l_step in zip(free, lock):
        plan = f_step[0, 0].plan
        own = {d: len(plan.group_micro_batches(d)) for d in range(2)}
        unequal += own[0] != own[1]
        for (d, c), step in f_step.items():
            assert len(step.micro_batches) == own[d] >= 1
            padded = l_step[d, c].micro_batches
            assert len(padded) == plan.slots
            assert all(p.valid_labels == 0 and p.num_tokens == 1 for p in padded[own[d]:])
            for a, b in zip(step.micro_batches, padded):  # the same buffers
                assert torch.equal(a.input, b.input) and torch.equal(a.labels, b.labels)
            assert step.local_valid_tokens == l_step[d, c].local_valid_tokens
            assert step.global_valid_tokens == l_step[d, c].global_valid_tokens
    assert unequal, "no step of the data gives the DP ranks unequal micro-batch counts"


def test_free_running_rank_without_micro_batches_runs_one_pad():
    """One sequence per global batch over DP 2: one DP rank has no micro-batch, and runs
    exactly one pad pass (FSDP's first all-gathers and last reduce-scatter need it)."""
    grid = _grid(2, 1, True, global_batch=1)
    step = _steps(grid, 1)[0]
    plan = step[0, 0].plan
    idle = [d for d in range(2) if not plan.group_micro_batches(d)]
    assert idle, "both DP ranks got a micro-batch out of one sequence"
    for d in idle:
        mbs = step[d, 0].micro_batches
        assert len(mbs) == 1 and mbs[0].valid_labels == 0 and mbs[0].num_tokens == 1


# ---------------------------------------------------------------- config


def test_free_running_refuses_skrull_pool():
    with pytest.raises(ValueError) as info:
        SkrullConfig(policy="skrull-pool", free_running=True, cost_model="h100-assumed")
    text = str(info.value)
    assert "skrull.free_running" in text and "skrull.policy = 'skrull-pool'" in text and "\n" not in text
    SkrullConfig(policy="skrull", free_running=True, cost_model="h100-assumed")  # fine


def test_free_running_with_pool_fails_at_config_time_from_flags(monkeypatch):
    from skrull_ext.train.job.job_file import load_config

    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", DEBUG, "--parallelism.context_parallel_degree", "2",
                     "--skrull.policy", "skrull-pool", "--skrull.free_running"])
    text = str(info.value)
    assert "skrull.free_running = true" in text and "skrull-pool" in text and "\n" not in text


def _profile(tmp_path, **memory) -> str:
    """A copy of the shipped CPU profile with its [memory] figures replaced."""
    import tomli_w
    import tomllib

    data = tomllib.loads(Path(CPU_PROFILE).read_text())
    data["memory"] = {**data["memory"], **memory}
    for key in [k for k, v in memory.items() if v is None]:
        del data["memory"][key]
    path = tmp_path / "profile.toml"
    path.write_text(tomli_w.dumps(data))
    return str(path)


# ---------------------------------------------------------------- profiler account


class _Tiny(nn.Module):
    def __init__(self, frozen: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({"0": nn.Linear(10, 10), "1": nn.Linear(10, 10)})
        self.tok_embeddings = nn.Embedding(20, 10)
        if frozen:  # a LoRA-like base: only layer 1 trains
            for p in [*self.layers["0"].parameters(), *self.tok_embeddings.parameters()]:
                p.requires_grad_(False)


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_profiler_static_account_of_free_running(frozen, param_dtype):
    from skrull_ext.profile.memory import static_memory
    from skrull_ext.train.job.job_file import load_job

    config = load_job(DEBUG)
    config.training.mixed_precision_param = param_dtype
    model = _Tiny(frozen)
    n = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (n, trainable) == (420, 110 if frozen else 420)
    jm = SimpleNamespace(config=config, model=model)
    off = static_memory(jm, 4)
    config.skrull.free_running = True
    on = static_memory(jm, 4)
    mp_bytes = 2 if param_dtype == "bfloat16" else 4
    assert off.free_running == 0
    assert on.free_running == n * mp_bytes + trainable * 4  # gradients accumulate in float32
    assert math.isclose(on.total - off.total, on.free_running)


# ---------------------------------------------------------------- FSDP on gloo

MICRO_BATCHES = {0: 3, 1: 1}
"""Rank 0 runs 3 micro-batches a step, rank 1 one: no pads."""


class _Net(nn.Module):
    """Three blocks and a head, the same weights in every process."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleDict({str(i): nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for i in range(3)})
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return self.head(x)


def _data(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(2 + j, 8, generator=g) for j in range(sum(MICRO_BATCHES.values()))]


def _loss(out: torch.Tensor, total: int) -> torch.Tensor:
    return out.pow(2).sum() / total


def _free_step(model, free, opt, calls, step: int, rank: int) -> dict:
    """One free-running step of this rank's micro-batches: its gradients (whole), the units
    left unsharded after it and the collectives it issued; then the optimizer steps."""
    world = dist.get_world_size()
    data = _data(step)
    total = sum(x.shape[0] for x in data)
    first = sum(MICRO_BATCHES[r] for r in range(rank))
    mine = data[first:first + MICRO_BATCHES[rank]]
    before = dict(calls)
    free.begin()
    for j, x in enumerate(mine):
        if j == len(mine) - 1:
            free.last()
        # FSDP averages gradients over the ranks; x world makes it the sum.
        (_loss(model(x), total) * world).backward()
    free.end()
    unsharded_after = free.unsharded()
    grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    opt.step()
    opt.zero_grad()
    return {"grads": grads, "unsharded": unsharded_after, "calls": {k: calls[k] - before[k] for k in calls}}


def _fsdp_worker(rank: int, world: int, store: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from skrull_ext.train.free_running import (FreeRunningFSDP, _clear_forward_trackers, _param_groups,
                                               after_forward_only)

    with gloo_group(store, rank, world):
        # FSDP2's collectives by name: torch 2.13 calls dist.*_single, 2.11 all_gather_into_tensor and
        # reduce_scatter_tensor (whichever this torch has and FSDP calls is counted).
        calls = count_calls(dist, {name: next(a for a in spellings if hasattr(dist, a)) for name, spellings in {
            "all_gather": ("all_gather_single", "all_gather_into_tensor"),
            "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}.items()})
        mesh = init_device_mesh("cpu", (world,))
        model = _Net()
        for block in model.layers.values():  # as torchtitan: blocks reshard after forward, the root does not
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        free = FreeRunningFSDP([model])
        record = []
        for step in range(2):
            record.append(_free_step(model, free, opt, calls, step, rank))
        # Forward resharding restored: torchtitan's blocks reshard after a (validation) forward.
        with torch.no_grad():
            model(_data(9)[0])
        record.append({"after_eval": free.unsharded()})
        # After each forward-only pass FSDP is reset as a backward leaves it (torch >= 2.13's
        # reset_iter_state, then the earlier torch's path), and the next uneven step trains exactly.
        for step, reset in ((2, after_forward_only), (3, lambda parts: _clear_forward_trackers(parts[0]))):
            with torch.no_grad():
                model(_data(9)[0])
            stale = len(_param_groups(model)[0].comm_ctx.post_forward_order)
            reset([model])
            record.append({"stale": stale, "left": len(_param_groups(model)[0].comm_ctx.post_forward_order),
                           "unsharded": free.unsharded(), **_free_step(model, free, opt, calls, step, rank)})
        torch.save(record, Path(out) / f"rank{rank}.pt")


def _reference() -> list[dict[str, torch.Tensor]]:
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    grads = []
    for step in range(4):
        data = _data(step)
        total = sum(x.shape[0] for x in data)
        for x in data:
            _loss(model(x), total).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return grads


@pytest.mark.slow
def test_fsdp_free_running_unequal_micro_batches_gloo(tmp_path):
    """Two gloo ranks running 3 and 1 micro-batches per step under FreeRunningFSDP: the
    gradients of both steps equal one process's over all 4 (the second step's forward
    used the parameters the optimizer updated: nothing stale), every rank issues one
    all-gather and one reduce-scatter per FSDP unit per step whatever its micro-batch
    count, and every unit is resharded after the step and after a no-grad forward."""
    # Forks of this process, which has torch imported (a spawned rank imported torch and this module
    # again: ~5 s of CPU each); spawned where this process holds a process group, which a fork would
    # inherit initialised: bench overlap's rule for its CPU ranks, the same reason.
    from skrull_ext.bench.overlap import start_method

    mp.start_processes(_fsdp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method=start_method("cpu"))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    reference = _reference()
    units = 4  # 3 blocks + the root (the head)
    for step in range(2):
        for r in range(2):
            got = ranks[r][step]
            print(f"step {step + 1}, rank {r} ({MICRO_BATCHES[r]} micro-batches): collectives {got['calls']}")
            assert got["calls"] == {"all_gather": units, "reduce_scatter": units}
            assert got["unsharded"] == []
            for name, ref in reference[step].items():
                torch.testing.assert_close(got["grads"][name], ref, rtol=1e-5, atol=1e-7)
    assert ranks[0][2]["after_eval"] == ranks[1][2]["after_eval"] == ["FSDP_Net"]  # only the root keeps its own
    # Each no-grad forward left its units in the backward-prefetch order; the reset cleared it and
    # resharded the root, and the next uneven step (3 and 1 micro-batches) trained exactly.
    for step, forwards in ((2, 2), (3, 1)):  # before step 2: the forward above too
        for r in range(2):
            got = ranks[r][step + 1]
            assert got["stale"] == forwards * units and got["left"] == 0 and got["unsharded"] == []
            assert got["calls"] == {"all_gather": units, "reduce_scatter": units}
            for name, ref in reference[step].items():
                torch.testing.assert_close(got["grads"][name], ref, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_trainer_refuses_free_running_that_does_not_fit(tmp_path):
    """The debug job with bucket_size "profile" takes the shipped profile's BucketSize (3696),
    derived without free-running's unsharded copies: the trainer refuses at start, one
    line naming the key, the bytes needed and available, exit status 2. One forked rank
    (tests/integration_tests/forked.py: the entry point run as ``python -m skrull_ext.train``
    without its ~10 s of imports); a user error in fresh interpreters of the entry point is
    tests/integration_tests/test_runtime_failures.py's."""
    from tests.integration_tests import forked
    from tests.integration_tests.launch import _env

    rc, out = forked.launch(1, "skrull_ext.train", ["--config-file", DEBUG, "--training.steps", "1",
                                                    "--skrull.free_running", "--skrull.bucket_size", "profile",
                                                    "--dump_folder", str(tmp_path)], str(tmp_path), _env(), 300)
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, out[-3000:]
    print(errors[0])
    assert "error: skrull.free_running = true needs " in errors[0] and "usable" in errors[0]
    # the BucketSize and the checkpointing mode chosen before, whose activations were checked again
    assert "bucket_size 3696 under activation checkpointing " in errors[0] and "usable 1024.0 MiB" in errors[0]
    assert "Traceback" not in out


def test_param_groups_on_both_fsdp_state_layouts():
    """torch >= 2.13 keeps a unit's groups in ``_fsdp_param_groups``; torch 2.11-2.12 keeps at
    most one in ``_fsdp_param_group`` (the README's job died on 2.11 with AttributeError)."""
    from skrull_ext.train.free_running import _param_groups

    a, b = object(), object()

    class Unit:
        def __init__(self, state):
            self.state = state

        def _get_fsdp_state(self):
            return self.state

    assert _param_groups(Unit(SimpleNamespace(_fsdp_param_groups=[a, b]))) == [a, b]
    assert _param_groups(Unit(SimpleNamespace(_fsdp_param_group=a))) == [a]
    assert _param_groups(Unit(SimpleNamespace(_fsdp_param_group=None))) == []
