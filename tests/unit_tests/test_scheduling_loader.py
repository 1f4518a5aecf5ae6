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


def _strip_tp_pad(buf):
    """``buf`` without the pad ``pad_to_multiple`` put after its local sequences (its last local one)."""
    at, extra = sum(buf.meta.local_lens[:-1]), buf.meta.local_lens[-1]
    return [torch.cat([t[0, :at], t[0, at + extra:]]) for t in (buf.input, buf.labels, buf.positions)]


@pytest.mark.parametrize("dp, cp, tp", [(1, 2, 2), (2, 2, 3), (1, 1, 4)])
def test_tp_pads_each_buffer_to_a_multiple_after_its_local_sequences(dp, cp, tp):
    """Under TP each rank's buffer is padded to a multiple of the TP degree (sequence parallelism
    shards it evenly between blocks: buffers.pad_to_multiple): the pad is one more local sequence
    of ignored tokens right after the local ones, and without it the buffers are the TP 1 loader's."""
    plain = _loaders(dp, cp, 256 if cp > 1 else 512)
    padded = _loaders(dp, cp, 256 if cp > 1 else 512)
    for loader in padded.values():
        loader.attach(loader.scheduler, loader.cp_rank, cp, tp=tp)
    grew = 0
    for _ in range(3):
        for key in plain:
            a, b = plain[key].next_step(), padded[key].next_step()
            assert a.global_valid_tokens == b.global_valid_tokens
            assert len(a.micro_batches) == len(b.micro_batches)
            for x, y in zip(a.micro_batches, b.micro_batches):
                assert y.num_tokens % tp == 0 and y.num_tokens - x.num_tokens < tp
                assert y.meta.dist_lens == x.meta.dist_lens and y.valid_labels == x.valid_labels
                if y.num_tokens == x.num_tokens:
                    assert y.meta.local_lens == x.meta.local_lens
                    continue
                grew += 1
                assert y.meta.local_lens[:-1] == x.meta.local_lens
                extra = y.meta.local_lens[-1]
                at = sum(x.meta.local_lens)
                assert (y.input[0, at:at + extra] == 0).all() and (y.labels[0, at:at + extra] == IGNORE_INDEX).all()
                assert y.positions[0, at:at + extra].tolist() == list(range(extra))
                for got, want in zip(_strip_tp_pad(y), (x.input[0], x.labels[0], x.positions[0])):
                    assert torch.equal(got, want)
    assert grew  # some buffer was not a multiple already


def test_tp_pad_leaves_the_real_tokens_attention_unchanged():
    """The pad attends only itself: DACP's attention of the real tokens is the unpadded buffer's."""
    from skrull_ext.attention import DacpAttention
    from skrull_ext.data.steps.buffers import pad_to_multiple

    grid = _loaders(1, 1, 512)
    source = grid[0, 0].source
    samples = [source[i] for i in range(3)]
    buf = set_buffer(samples, [s.length for s in samples], [0] * 3, [1] * 3, rank=0, world=1, group=True)
    padded = pad_to_multiple(buf, 5)
    assert padded.num_tokens % 5 == 0 and padded.num_tokens > buf.num_tokens
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, padded.num_tokens, 4, 8, generator=gen) for _ in range(3))
    n = buf.num_tokens
    attn = DacpAttention(None, kernel="dense")
    got = attn(q, k, v, attention_masks=padded.meta)[:, :n]
    want = attn(q[:, :n], k[:, :n], v[:, :n], attention_masks=buf.meta)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert pad_to_multiple(buf, 1) is buf and pad_to_multiple(padded, 5) is padded
