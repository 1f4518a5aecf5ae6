"""The scheduling dataloader under policy skrull-pool: every rank of DP 2 x CP 2
gets one buffer per plan slot, and the buffers of each micro-batch put back
together (unshard_set_buffer) give the global batch's samples, tokens,
labels and true positions, sequences longer than bucket_size x CP included."""

import torch

from skrull_ext.attention import unshard_set_buffer
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.scheduler.plan import Plan
from skrull_ext.train.job.skrull_config import SkrullConfig

DP, CP, BUCKET, BATCH = 2, 2, 128, 16


def _grid():
    section = SkrullConfig(bucket_size=BUCKET, policy="skrull-pool", cost_model="h100-assumed", overlength="error")
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=BATCH, vocab_size=2048)
    grid = {}
    for d in range(DP):
        for c in range(CP):
            loader = config.build(dp_world_size=DP, dp_rank=d)
            loader.attach(Scheduler(section.scheduler_config(DP, CP, lookahead=1), cost_model.preset("llama3-debug")), c, CP)
            grid[d * CP + c] = loader
    return grid


def test_pool_buffers_reassemble_the_global_batch():
    grid = _grid()
    widened = 0
    for _ in range(4):
        steps = {r: loader.next_step() for r, loader in grid.items()}
        plan, source = steps[0].plan, grid[0].source
        assert isinstance(plan, Plan) and plan.truncated == [] and plan.dropped == []
        indices = source.global_batch(steps[0].step, BATCH)
        assert all(len(s.micro_batches) == plan.slots for s in steps.values())
        seen = []
        for mb in plan.micro_batches:
            block = range(mb.first_group * CP, (mb.first_group + mb.groups) * CP)
            bufs = {r: steps[r].micro_batches[mb.slot] for r in range(DP * CP)}
            # The world's buffers, ranks outside the block (or holding nothing of it) empty.
            def field(name, r):
                b = bufs[r]
                if r in block and b.meta.dist_sets is not None:
                    return getattr(b, name)[0]
                return torch.zeros(0, dtype=torch.long)
            for name in ("input", "labels", "positions"):
                back = unshard_set_buffer([field(name, r) for r in range(DP * CP)], mb.lengths, mb.first_rank,
                                           mb.num_ranks)
                for k, got in zip(mb.seqs, back):
                    want = torch.arange(len(got)) if name == "positions" else getattr(source[indices[k]], name)
                    torch.testing.assert_close(got, want)
            for r in block:  # every rank of a set holds its shard in a pool buffer
                if any(a <= r < a + n for a, n in zip(mb.first_rank, mb.num_ranks)):
                    assert bufs[r].meta.dist_sets is not None and bufs[r].meta.num_tokens <= BUCKET + 1
            seen += mb.seqs
            widened += sum(1 for s, n in zip(mb.lengths, mb.num_ranks) if s > BUCKET * CP and n == DP * CP)
        assert sorted(seen) == list(range(BATCH))
        total = sum(int((source[i].labels != IGNORE_INDEX).sum()) for i in indices)
        assert all(s.global_valid_tokens == total for s in steps.values())
        assert sum(s.local_valid_tokens for s in steps.values()) == total
    assert widened > 0, "no sequence longer than bucket_size x CP in these steps: the test would not cover them"
