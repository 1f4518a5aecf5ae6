"""Chunked documents at DP 2 (issue 55 item 3): ``--skrull.overlength chunk`` on real gloo
processes, free-running, the plans deciding which DP rank trains each document.

The debug job from the shared seed checkpoint with samples up to 2,048 tokens and a
BucketSize of 256 (longer ones trained whole, in chunks), look-ahead off so each step trains
its own global batch. At DP 2 x CP 1 each document is trained by the rank its plan assigns
(the plan log's ``chunked_here``): every over-limit sample of a step exactly once, on one rank,
the run summary counting them whole. The same job on one process (its unscheduled reference:
every document on the one rank) gives the same losses, and the same gradients at step 3, where
the plan puts its one document on DP rank 0 and every planned sample on DP rank 1.
"""

import os

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import SKRULL
from tests.integration_tests.launch import assert_same_grads, train_from_seed
from tests.integration_tests.test_parity_skrull import GRAD

CHUNK = ["--skrull.overlength", "chunk", "--dataloader.max_len", "2048", "--training.seq_len", "2048",
         "--skrull.plan_log"]
STEPS, CHECK = 3, 3
LIMIT = 256


def _plans(run, ranks: int) -> list[dict[int, dict]]:
    return [read_plan_log(os.path.join(run.dump, "skrull_plans", f"rank{r}.jsonl")) for r in range(ranks)]


@pytest.mark.slow
def test_chunked_documents_at_dp2_run_once_each_and_match_one_process(workdir, seed):
    one = train_from_seed(workdir, "chunk_dp1", 1, "skrull_ext.train", SKRULL, seed, STEPS, extra=CHUNK,
                          grads_at=CHECK)
    two = train_from_seed(workdir, "chunk_dp2_free", 2, "skrull_ext.train", SKRULL, seed, STEPS,
                          extra=[*CHUNK, "--skrull.free_running"], grads_at=CHECK)
    assert "timeline free" in two.output
    plans = _plans(two, 2)
    ranks_with_documents = set()
    for step in range(1, STEPS + 1):
        a, b = plans[0][step], plans[1][step]
        assert a["plan_digest"] == b["plan_digest"] and a["samples"] == b["samples"]
        planned = len(a["lengths"])
        over = a["samples"][planned:]  # the step's samples beyond the limit, trained in chunks
        here = [r["chunked_here"] for r in (a, b)]
        assert sorted(here[0] + here[1]) == sorted(over), (step, here, over)  # each once, on one rank
        for r, rec in enumerate((a, b)):
            assert [rec["plan_chunked_dp_rank"][k] for k in range(len(over)) if over[k] in here[r]] == \
                [r] * len(here[r])
            assert all(n > LIMIT for n in rec["chunked_here_lengths"])
            if here[r]:
                ranks_with_documents.add(r)
    assert ranks_with_documents == {0, 1}, "each rank trains chunked documents at some step (step 2 on this data)"
    out = two.output
    assert (f"Run summary: samples read {8 * STEPS} = trained whole {8 * STEPS} + trained cut 0 + skipped 0"
            in out), out[-3000:]
    # The unscheduled reference: one process trains every document; the same losses and gradients.
    ref, got = one.losses, two.losses
    print(f"DP 1 {ref}\nDP 2 {got}")
    assert len(got) == STEPS and max(abs(x - y) for x, y in zip(ref, got)) < 1e-4, f"{ref} vs {got}"
    worst, rel = assert_same_grads(two.grads, one.grads, **GRAD)
    print(f"step {CHECK} gradients, DP 2 vs DP 1: max |diff| {worst:.3g}, relative norm {rel:.3g}")
