"""What a lockstep pad chunk runs against what the cost model prices it at (CostModel.pad_chunks_us,
cpp/include/skrull/cost_model.hpp), counted with a real process group: 2 gloo ranks, CP 2.

A pad chunk (train/chunked.py ``pad_chunks``: one ignored token a CP rank after its document) is sharded
over the CP group like any chunk: each layer all-gathers its K/V and reduce-scatters their gradient, and a
checkpointed one (every pass but its position's last) runs its forward again in backward, handed the K/V its
forward gathered (attention/prefix.py: no second gather; a traced chunk's recompute gathers again,
CostModel.chunk_regather). Priced on a cost
model where every collective takes 1 us and nothing else costs anything, pad_chunks_us is the number of
collectives a rank issues; the pad pass's price (pad_pass_us, what pad chunks were priced at) counts none."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from skrull_ext import _core
from skrull_ext.train.chunked import attention_layers, chunked_loss
from tests.unit_tests.gloo_worker import gloo_group
from tests.unit_tests.test_chunked import _loss, _model

# (document tokens, chunk, pad chunks): an all-pad document of 3, and 2 pads after a 10-token document
# (3 chunks of 4, the last padded to 2: the pads' keys start at 10).
CASES = [(0, 4, 3), (10, 4, 2)]


def _worker(rank: int, store: str, outdir: str) -> None:
    with gloo_group(store, rank, 2):
        model = _model()
        layers = attention_layers([model])
        out, replays = {}, {}
        for length, chunk, pads in CASES:
            tokens = torch.randint(0, 100, (length,), generator=torch.Generator().manual_seed(length))
            labels = tokens.clone()
            for m in layers:
                m.stats.reset()
            chunked_loss(model, tokens, labels, chunk, _loss, layers=layers, group=dist.group.WORLD,
                         pad_chunks=pads).loss.backward()
            padded = (sum(m.stats.all_gathers for m in layers), sum(m.stats.reduce_scatters for m in layers))
            padded_replays = sum(m.stats.replays for m in layers)
            for m in layers:
                m.stats.reset()
            # the document alone, its last chunk then not recomputed: what the pads add is the difference
            if length:
                chunked_loss(model, tokens, labels, chunk, _loss, layers=layers,
                             group=dist.group.WORLD).loss.backward()
            alone = (sum(m.stats.all_gathers for m in layers), sum(m.stats.reduce_scatters for m in layers))
            out[(length, chunk, pads)] = (padded, alone)
            replays[(length, chunk, pads)] = padded_replays - sum(m.stats.replays for m in layers)
        torch.save({"counts": out, "replays": replays, "layers": len(layers)}, Path(outdir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> list[dict]:
    from tests.integration_tests import forked

    tmp = tmp_path_factory.mktemp("pad_chunk")
    forked._context()
    mp.start_processes(_worker, args=(str(tmp / "store"), str(tmp)), nprocs=2, start_method="forkserver")
    return [torch.load(tmp / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_pad_chunks_collectives_are_what_its_price_counts(counted, case):
    length, chunk, pads = case
    for rank in counted:
        layers = rank["layers"]
        (gathers, scatters), (own_gathers, own_scatters) = rank["counts"][case]
        shape, comm = _core.ModelShape(layers, 256, 256, 4), _core.CommModel([1.0], [1.0])
        unit = _core.CostModel(shape, 0.0, 0.0, comm)  # eager chunks: the recompute reuses the forward's K/V
        start = -(-length // 2) * 2
        assert unit.pad_chunks_us(start, pads, 2) == layers * 2 * pads
        assert unit.pad_pass_us() == 0.0  # the old price: no collective
        # A traced chunk's recompute gathers again (not counted here: a functional collective inside the
        # compiled block has no DacpStats): a gather more a layer for every pad but the last.
        traced = _core.CostModel(shape, 0.0, 0.0, comm, chunk_regather=True)
        assert traced.pad_chunks_us(start, pads, 2) == layers * (3 * (pads - 1) + 2)
        # The pads' own: a gather and a reduce-scatter each; the recompute of every pad but the last, and of
        # the document's last chunk (no longer its position's last pass), gathers nothing: the forward's
        # K/V replayed (attention/prefix.py), which DacpStats counts as replays.
        assert scatters - own_scatters == layers * pads
        assert gathers - own_gathers == layers * pads
        assert rank["replays"][case] == layers * (pads - 1 + (1 if length else 0))
        assert (gathers - own_gathers) + (scatters - own_scatters) == unit.pad_chunks_us(start, pads, 2)
        if length:  # all the pads add, as the plan prices it: this document on DP rank 0, `pads` chunks fewer
            own, last = -(-length // chunk), length - (length - 1) // chunk * chunk  # than DP rank 1's
            priced = _core.lockstep_pad_us([length, (own + pads) * chunk], [own, own + pads], [last, chunk],
                                           [0, 1], 2, 2, unit)
            assert priced == [(gathers - own_gathers) + (scatters - own_scatters), 0.0]
