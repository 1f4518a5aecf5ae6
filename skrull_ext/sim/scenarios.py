"""Named job shapes: the paper's evaluation settings, as data.

The paper (arXiv 2505.19609) runs Qwen2.5-0.5B with BucketSize 26K and Qwen2.5-7B
with 13K at <DP=4, CP=8, BatchSize=64>, except 7B on ChatQA2 at
<DP=2, CP=16, BatchSize=40>. Real length files use the default shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from skrull_ext.sim import datasets
from skrull_ext.sim.packing import Shape
from skrull_ext.sim.simulator import Scenario

MODELS = ("qwen2.5-0.5b", "qwen2.5-7b")
BUCKET_SIZE: dict[str, int] = {"qwen2.5-0.5b": 26 * 1024, "qwen2.5-7b": 13 * 1024}
"""The paper's BucketSize per model (tokens per rank); other models get DEFAULT_BUCKET_SIZE."""
DEFAULT_BUCKET_SIZE = 26 * 1024
DEFAULT_SHAPE = {"dp": 4, "cp": 8, "batch_size": 64}
SHAPE_EXCEPTIONS: dict[tuple[str, str], dict[str, int]] = {
    ("chatqa2", "qwen2.5-7b"): {"dp": 2, "cp": 16, "batch_size": 40},
}
SUITES: dict[str, tuple[str, ...]] = {
    "paper": tuple(datasets.PAPER_DISTRIBUTIONS),
    "real": datasets.REAL_DEFAULT,
    "all": (*datasets.PAPER_DISTRIBUTIONS, *datasets.REAL_DEFAULT),
}


def paper_shape(dataset: str, model: str, timeline: str = "lockstep") -> Shape:
    shape = {**DEFAULT_SHAPE, **SHAPE_EXCEPTIONS.get((dataset, model), {})}
    return Shape(bucket_size=BUCKET_SIZE.get(model, DEFAULT_BUCKET_SIZE), timeline=timeline, **shape)


def grid(dataset_names: Sequence[str], models: Sequence[str], *, dp: int | None = None, cp: int | None = None,
         batch_size: int | None = None, bucket_size: int | None = None,
         capacity: int | None = None, timeline: str = "lockstep") -> list[Scenario]:
    """Every dataset x model at the paper's shape, with any given field overriding it."""
    out = []
    for d in dataset_names:
        datasets.get(d)  # fail early on a bad name
        for m in models:
            base = paper_shape(d, m)
            pick = lambda given, default: default if given is None else given  # noqa: E731
            shape = Shape(dp=pick(dp, base.dp), cp=pick(cp, base.cp), batch_size=pick(batch_size, base.batch_size),
                          bucket_size=pick(bucket_size, base.bucket_size), timeline=timeline)
            out.append(Scenario(d, m, shape, capacity))
    return out
