"""FSDP2 on gloo with the p2p collectives (torchtitan_patches/fsdp_gloo.py):
the same gradients and weights as FSDP's own collectives, over real gloo
processes, and FSDP's default wherever the p2p transport does not apply."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from tests.unit_tests.gloo_worker import count_calls, gloo_group
from torchtitan_patches import fsdp_gloo


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        # odd sizes: FSDP pads dim 0 to the world size, the p2p slices must follow it
        self.layers = nn.ModuleList([nn.Linear(9, 9), nn.Linear(9, 7), nn.Linear(7, 9)])
        self.head = nn.Linear(9, 3)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def _train(model: nn.Module, rank: int, steps: int = 2) -> list[dict[str, torch.Tensor]]:
    """Two SGD steps on rank-dependent data; per step the full gradients, then the full weights."""
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    out = []
    for step in range(steps):
        x = torch.randn(5, 9, generator=torch.Generator().manual_seed(10 * step + rank))
        model(x).pow(2).sum().backward()
        out.append({n: p.grad.full_tensor().clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    out.append({n: p.detach().full_tensor().clone() for n, p in model.named_parameters()})
    return out


WORLDS = (3, 2)
"""The worlds the p2p collectives are checked on, in one spawn of 3 processes (a spawned
process spends seconds importing torch; the check itself takes a fraction of one): all 3
ranks, then ranks 0 and 1 as a group of their own (FSDP's mesh is such a sub-group in a job
with more than one parallel dimension)."""


def _worker(rank: int, store: str, out: str) -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with gloo_group(store, rank, max(WORLDS)):
        # count what the comms send point to point
        calls = count_calls(fsdp_gloo, {"p2p_gather": "p2p_gather", "p2p_scatter_sum": "p2p_scatter_sum"})
        for world in WORLDS:
            if world == max(WORLDS):
                mesh = init_device_mesh("cpu", (world,))
            else:
                group = dist.new_group(list(range(world)))  # every rank calls new_group, members or not
                if rank >= world:
                    continue
                mesh = DeviceMesh.from_group(group, "cpu")
            runs = {}
            for p2p in (False, True):
                model = _Net()
                for layer in model.layers:  # as torchtitan: blocks reshard after forward, the root does not
                    fully_shard(layer, mesh=mesh, reshard_after_forward=True)
                fully_shard(model, mesh=mesh, reshard_after_forward=False)
                if p2p:
                    assert fsdp_gloo.fit_fsdp_to_gloo(model) == 4
                else:
                    for m in model.modules():
                        if hasattr(m, "set_force_sum_reduction_for_comms"):
                            m.set_force_sum_reduction_for_comms(True)
                before = dict(calls)
                runs[p2p] = {"record": _train(model, rank), "calls": {k: calls[k] - before[k] for k in calls}}
            torch.save(runs, Path(out) / f"world{world}.rank{rank}.pt")


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> Path:
    """The folder of every world's per-rank records (``_worker``)."""
    out = tmp_path_factory.mktemp("fsdp_gloo")
    mp.start_processes(_worker, args=(str(out / "store"), str(out)), nprocs=max(WORLDS), start_method="spawn")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_p2p_fsdp_matches_gloo_collectives(spawned, world):
    """FSDP2 over gloo ranks, 3 blocks + a root with odd sizes, two SGD steps: with
    fit_fsdp_to_gloo, every gradient and weight equals those of FSDP's own gloo
    collectives (bit for bit at 2 ranks, where a sum of two is the same either way;
    to float rounding at 3, where the p2p sum runs in rank order and gloo's ring
    in its own), and every all-gather and reduce-scatter went point to point:
    per step one gather per block in forward and again in backward (they reshard
    after forward) and one for the root, and one reduce-scatter per unit."""
    ranks = [torch.load(spawned / f"world{world}.rank{r}.pt", weights_only=False) for r in range(world)]
    for runs in ranks:
        assert runs[False]["calls"] == {"p2p_gather": 0, "p2p_scatter_sum": 0}
        assert runs[True]["calls"] == {"p2p_gather": 2 * (3 * 2 + 1), "p2p_scatter_sum": 2 * 4}
        for default, p2p in zip(runs[False]["record"], runs[True]["record"]):
            assert default.keys() == p2p.keys()
            for name in default:
                if world == 2:
                    assert torch.equal(default[name], p2p[name]), name
                else:
                    torch.testing.assert_close(p2p[name], default[name], rtol=1e-6, atol=1e-7, msg=name)
    # the full tensors are the same on every rank
    for name, value in ranks[0][True]["record"][-1].items():
        for other in ranks[1:]:
            assert torch.equal(other[True]["record"][-1][name], value)


class _Recorder:
    def __init__(self) -> None:
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)
        return "default"


@pytest.mark.parametrize("op, async_op, gloo", [
    (dist.ReduceOp.AVG, False, True),       # a reduction the p2p sum does not make
    (dist.ReduceOp.SUM, True, True),        # asynchronous: FSDP waits only on a c10d Work
    (dist.ReduceOp.SUM, False, False),      # not gloo (NCCL): FSDP's own collective
])
def test_reduce_scatter_falls_back_to_fsdp_default(monkeypatch, op, async_op, gloo):
    monkeypatch.setattr(fsdp_gloo, "_on_gloo", lambda group: gloo)
    monkeypatch.setattr(fsdp_gloo, "p2p_scatter_sum", lambda *a: pytest.fail("p2p used"))
    comm = fsdp_gloo.P2PReduceScatter()
    comm._default = _Recorder()
    out, full = torch.empty(2), torch.ones(4)
    assert comm(out, full, None, op, async_op) == "default"
    assert comm._default.calls == [(out, full, None, op, async_op)]


@pytest.mark.parametrize("async_op, gloo", [(True, True), (False, False)])
def test_all_gather_falls_back_to_fsdp_default(monkeypatch, async_op, gloo):
    monkeypatch.setattr(fsdp_gloo, "_on_gloo", lambda group: gloo)
    monkeypatch.setattr(fsdp_gloo, "p2p_gather", lambda *a: pytest.fail("p2p used"))
    comm = fsdp_gloo.P2PAllGather()
    comm._default = _Recorder()
    out, shard = torch.empty(4), torch.ones(2)
    assert comm(out, shard, None, async_op) == "default"
    assert comm._default.calls == [(out, shard, None, async_op)]


def test_allocate_gives_the_asked_buffer():
    for comm in (fsdp_gloo.P2PAllGather(), fsdp_gloo.P2PReduceScatter()):
        t = comm.allocate((6,), dtype=torch.bfloat16, device=torch.device("cpu"))
        assert t.shape == (6,) and t.dtype == torch.bfloat16
