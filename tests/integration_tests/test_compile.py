"""torchtitan's ``[compile] enable = true`` (each TransformerBlock compiled with
``fullgraph=True``) trains like eager, under both batchings.

From one seed checkpoint, float32, CP=2 over gloo (2 processes), 5 steps:

- Skrull's batching: the DACP attention runs as the ``skrull::dacp_attention``
  custom op inside the compiled blocks (attention/compiled.py), or, in a
  micro-batch with no distributed sequence, traced into them
  (attention/local_only.py); the losses and
  the check step's gradients equal the eager run's within float32 tolerance,
  and rank 0's DACP counters (calls, all-gathers, bytes) are the eager run's:
  the op ran the same exchange, outside the compiled region. The run is under
  full AC, where the compiled recomputation replays the forward's tape instead
  of exchanging again, and it still trains as the 1-process reference.
- torchtitan's batching (``--skrull.no-enable``): torchtitan's own CP
  attention (dense-mask SDPA on CPU) compiled, against the 1-process eager
  reference the parity tests hold every eager run to.
- Skrull compiled under TP: tests/integration_tests/test_chunk_dp_run.py's
  compiled TP 2 run (micro-batches and chunked documents, each rank's tokens
  padded to a multiple of the TP degree).

Each compiled run also computes the head and loss in chunks of 48 tokens
(train/head_loss.py; the loss compiled per chunk), whose checks live here
beside the compile checks so that the one run serves both under
``--dist loadfile`` (the eager chunked runs: test_head_loss_run.py). The
Skrull one is one run for the compile, chunk and AC checks
(conftest ``cp2_compile_ac_full_head_chunks``): each compiled run costs a
compile, and full AC's recompute partition, the chunked loss and the two
kinds of micro-batch compose in it as a job would run them.
Every run here traces under ``aot_eager``: the same dynamo graphs, guards and
AOT autograd partition (the recomputation included) as inductor, without its
C++ builds (two ranks building them cold cost CI ~120 s). Inductor's code
for the Skrull compiled path, around the custom op, for the traced all-local
attention and for the in-forward head chunk, is checked in one process on toy
sizes (tests/unit_tests/test_inductor_cpu.py): the op's
exchange is eager code inside it, the same whichever backend compiled the
block around it.

``fullgraph=True`` turns any graph break into an error, so a finished run is
a clean trace; the log is also checked for dynamo falling back to eager after
too many recompiles.
"""

import pytest

from tests.integration_tests.conftest import CHECK_STEP, SKRULL, STEPS
from tests.integration_tests.launch import assert_same_grads, train_from_seed
from tests.integration_tests.test_head_loss_run import IN_FORWARD, LINE
from tests.integration_tests.test_parity_skrull import (_exchange_counts, _exchanged_once,
                                                        _matches_reference_losses_and_grads)

# The compiled graphs reorder float32 sums (inductor also fuses elementwise ops:
# RMSNorm, RoPE, SiLU). Observed on this machine under inductor: losses within
# 1e-6, gradients max |diff| ~1e-7, ||diff|| / ||grad|| ~1e-6.
LOSS = 1e-4
GRAD = dict(rtol=1e-4, atol=1e-6, max_rel_norm=1e-5)
CP2 = ["--parallelism.context_parallel_degree", "2"]
AOT_EAGER = ["--compile.backend", "aot_eager"]


def _compiled(run) -> None:
    assert "Compiling each TransformerBlock with torch.compile" in run.output
    assert "hit config.recompile_limit" not in run.output and "cache_size_limit" not in run.output, \
        "dynamo hit its recompile limit and ran a block eagerly"


def _same_training(got, ref, label: str) -> None:
    a, b = got.losses, ref.losses
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"{label}: compiled {a}\n{' ' * len(label)}  eager    {b}\nmax loss |diff| {diff:.3g}")
    assert len(a) == len(b) == STEPS and diff < LOSS, f"{a} vs {b}"
    assert a[-1] < a[0], f"loss did not decrease: {a}"
    worst, rel = assert_same_grads(got.grads, ref.grads, **GRAD)
    print(f"step {CHECK_STEP} gradients, compiled vs eager: max |diff| {worst:.3g}, relative norm {rel:.3g}")


@pytest.fixture(scope="module")
def tt_compiled(workdir, seed):
    """torchtitan's batching compiled (aot_eager), its head in chunks of 48 tokens across the rows."""
    return train_from_seed(workdir, "tt_cp2_compile_head_chunks", 2, "skrull_ext.train", SKRULL, seed, STEPS,
                           extra=[*CP2, "--skrull.no-enable", "--compile.enable", *AOT_EAGER,
                                  "--loss.chunk_tokens", "48"], grads_at=CHECK_STEP)


@pytest.mark.slow
def test_compile_skrull_cp2_matches_eager(skrull_runs):
    """Compiled blocks (and loss, in chunks; under full AC) against the eager run with the head
    whole and no AC."""
    run, eager = skrull_runs["cp2_compile_ac_full_head_chunks"], skrull_runs["cp2"]
    _compiled(run)
    assert "torch._dynamo.config.recompile_limit 8 -> 24" in run.output  # train/compile_limit.py
    _same_training(run, eager, "skrull CP=2")
    got, ref = _exchange_counts(run), _exchange_counts(eager)
    for name in ("calls", "all_gathers", "reduce_scatters", "fwd_bytes", "bwd_bytes", "expected_all_gathers"):
        assert got[name] == ref[name], f"dacp_{name}: compiled {got[name]} vs eager {ref[name]}"
    # Both kinds of micro-batch ran compiled: with distributed sequences (the opaque op) and all
    # local (the attention traced into the block: attention/local_only.py).
    assert 0 < sum(got["all_gathers"]) < sum(got["calls"]), got


@pytest.mark.slow
def test_head_chunks_compiled_cp2_matches_reference(skrull_runs, reference):
    """torchtitan compiles the per-chunk loss (compile.components holds "loss") inside each chunk's
    checkpoint; the last chunk's other length recompiles it, and the recompute replays the same graph."""
    run = skrull_runs["cp2_compile_ac_full_head_chunks"]
    assert LINE in run.output and "Compiling the loss function with torch.compile" in run.output
    assert IN_FORWARD in run.output
    _matches_reference_losses_and_grads(run, reference)


@pytest.mark.slow
def test_compile_skrull_cp2_full_ac_matches_eager(skrull_runs, reference):
    """Compiled blocks under full AC: the 5 steps train as the 1-process reference (as eager
    cp2 does, to the same standard), and the recomputation replayed each layer's tape (no second
    exchange)."""
    run = skrull_runs["cp2_compile_ac_full_head_chunks"]
    _compiled(run)
    assert "Applied FullAC activation checkpointing" in run.output
    _matches_reference_losses_and_grads(run, reference)
    _exchanged_once(run, skrull_runs["cp2"], "compiled, full AC")


@pytest.mark.slow
def test_compile_torchtitan_batching_cp2_matches_eager(tt_compiled, reference):
    """Compiled against the 1-process eager reference (torchtitan's own trainer),
    which the eager CP=2 runs already equal (test_parity_*): no eager twin to launch."""
    _compiled(tt_compiled)
    _same_training(tt_compiled, reference, "torchtitan batching CP=2")


@pytest.mark.slow
def test_head_chunks_torchtitan_batching_cp2_matches_reference(tt_compiled, reference):
    """Rows of 4 x 256 tokens a CP rank: in forward, chunks of 48 tokens across the rows."""
    assert ("head and loss in chunks of up to 48 tokens, 22 chunks for the largest micro-batch (1024 tokens: "
            "local_batch_size x seq_len / cp)") in tt_compiled.output
    assert IN_FORWARD in tt_compiled.output
    _matches_reference_losses_and_grads(tt_compiled, reference)

