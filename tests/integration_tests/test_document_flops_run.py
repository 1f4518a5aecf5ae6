"""Document-aware FLOPs in a real run (skrull_ext/train/doc_flops.py): the README's
job (Skrull at CP 2 over gloo, its plan splitting, sharding and placing the
samples over two ranks) counts, each step, the hand formula's FLOPs over the
step's samples, whatever the schedule."""

import pytest

from tests.integration_tests.conftest import STEPS


@pytest.mark.slow
def test_a_skrull_run_counts_the_formulas_flops_over_its_samples(skrull_runs):
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.models.registry import build_model_spec
    from skrull_ext.train.doc_flops import DocumentFlops
    from skrull_ext.train.job.job_file import load_config
    from tests.integration_tests.conftest import SKRULL

    run = skrull_runs["cp2"]
    skrull = run.scalars("documents/flops")
    assert len(skrull) == STEPS
    # The formula over each step's samples (the debug job's lengths, all within CP 2's 512 tokens).
    config = load_config([*SKRULL, "--parallelism.context_parallel_degree", "2", "--dataloader.vocab_size", "2048"],
                         check=False)
    loader = SkrullDataLoader(config.dataloader, dp_world_size=1, dp_rank=0, tokenizer=None)
    spec = build_model_spec("llama3", "debugmodel")
    flops = DocumentFlops.of_model(spec.model, [spec.model.build()])
    want = [flops(min(n, 512) for _, n in loader.step_lengths(step)) for step in range(1, STEPS + 1)]
    assert skrull == pytest.approx(want, rel=1e-7)  # TensorBoard keeps float32 (ulp 6e-8)
    # Rate and line: every step logged both MFU figures' sources and said which is which.
    assert all(t > 0 for t in run.scalars("documents/tflops"))
    lines = [line for line in run.output.splitlines() if ": document-aware " in line]
    assert len(lines) == STEPS and all("torchtitan's tflops/mfu above price every token at seq_len" in x
                                       for x in lines)
