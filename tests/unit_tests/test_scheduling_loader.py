"""The scheduling dataloader: every (DP, CP) rank's buffers put back together
are exactly the global batch, each sequence once, in the agreed layout."""

import pytest
import torch

from skrull_ext.attention.meta import unshard_buffer
from skrull_ext.data.steps.buffers import pad_buffer, set_buffer
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig


def _loaders(dp: int, cp: int, bucket: int = 256, policy: str = "skrull"):
    section = SkrullConfig(bucket_size=bucket, policy=policy, cost_model="h100-assumed")
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=16, vocab_size=2048)
    grid = {}
    for d in range(dp):
        for c in range(cp):
            loader = config.build(dp_world_size=dp, dp_rank=d)
            loader.attach(Scheduler(section.scheduler_config(dp, cp, lookahead=1), cost_model.preset("llama3-debug")), c, cp)
            grid[d, c] = loader
    return grid


@pytest.mark.parametrize("dp, cp, policy", [(1, 2, "skrull"), (2, 2, "skrull"), (2, 2, "worstfit"), (1, 1, "skrull")])
def test_buffers_reassemble_the_global_batch(dp, cp, policy):
    bucket = 256 if cp > 1 else 512
    grid = _loaders(dp, cp, bucket, policy)
    for _ in range(3):
        steps = {key: loader.next_step() for key, loader in grid.items()}
        any_step = steps[0, 0]
        plan, source = any_step.plan, grid[0, 0].source
        indices = source.global_batch(any_step.step, 16)
        seen = []
        for d in range(dp):
            n_mb = plan.slots
            assert all(len(steps[d, c].micro_batches) == n_mb for c in range(cp))
            for j, mb_plan in enumerate(plan.group_micro_batches(d)):
                bufs = [steps[d, c].micro_batches[j] for c in range(cp)]
                assert all(b.meta.dist_lens == bufs[0].meta.dist_lens for b in bufs)
                assert all(b.meta.dist_sets is None for b in bufs)  # the CP group's own exchange
                for field in ("input", "labels"):
                    back = unshard_buffer([getattr(b, field)[0] for b in bufs], mb_plan.lengths, mb_plan.cp_rank)
                    for k, got in zip(mb_plan.seqs, back):
                        want = getattr(source[indices[k]], field)
                        torch.testing.assert_close(got, want)
                back = unshard_buffer([b.positions[0] for b in bufs], mb_plan.lengths, mb_plan.cp_rank)
                assert all(torch.equal(p, torch.arange(len(p))) for p in back)  # true positions
                seen += mb_plan.seqs
            for j in range(len(plan.group_micro_batches(d)), plan.slots):
                assert all(steps[d, c].micro_batches[j].valid_labels == 0 for c in range(cp))
        assert sorted(seen) == list(range(16))
        total = sum(int((source[i].labels != IGNORE_INDEX).sum()) for i in indices)
        assert all(s.global_valid_tokens == total for s in steps.values())
        assert sum(s.local_valid_tokens for s in steps.values()) == total


def test_rank_holding_nothing_gets_an_ignored_pad():
    grid = _loaders(1, 2)
    sample = grid[0, 0].source[0]
    buf = set_buffer([sample], [sample.length], [0], [1], rank=1, world=2, group=True)
    assert buf.num_tokens == 1 and buf.valid_labels == 0 and buf.meta.local_lens == [1]
    assert (buf.meta.cp_rank, buf.meta.cp_size) == (1, 2)
    # In world ranks, the pad takes this rank's CP coordinates (its group's exchange checks them).
    buf = set_buffer([sample], [sample.length], [0], [2], rank=3, world=4, cp_coords=(1, 2))
    assert buf.num_tokens == 1 and (buf.meta.cp_rank, buf.meta.cp_size) == (1, 2)
    assert pad_buffer(0, 2).meta.dist_lens == []


def test_distributed_sequences_are_padded_in_the_agreed_way():
    grid = _loaders(1, 2)
    sample = grid[0, 0].source[1]  # 72 tokens -> Lp = 72 (multiple of 4); use an odd cut
    n = 70
    bufs = [set_buffer([sample], [n], [0], [2], r, 2, group=True) for r in range(2)]
    assert [b.meta.dist_lens for b in bufs] == [[72], [72]]
    assert all(b.meta.dist_sets is None for b in bufs)  # the CP group's own exchange
    positions = torch.cat([b.positions[0] for b in bufs]).sort().values
    assert positions.tolist() == list(range(72))
    pad = torch.cat([b.labels[0][b.positions[0] >= n] for b in bufs])
    assert (pad == IGNORE_INDEX).all()


def test_attach_checks_the_shape():
    loader = SkrullDataLoader.Config(vocab_size=2048).build(dp_world_size=2, dp_rank=0)
    sched = Scheduler(SkrullConfig(cost_model="h100-assumed").scheduler_config(1, 2, lookahead=1))
    with pytest.raises(ValueError, match="scheduler is for DP 1 x CP 2"):
        loader.attach(sched, 0, 2)
    with pytest.raises(RuntimeError, match="attach"):
        next(iter(loader))
