# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Offline profiler: turn a job's model and this machine into the cost model
the scheduler reads (docs/design/cost_model.md; docs/profile.md).

    python -m skrull_ext.profile --config-file JOB.toml [--out profile.toml]
    torchrun --nproc_per_node N -m skrull_ext.profile --config-file JOB.toml

One concern per module:

    options.py  what to measure (ProfileOptions)
    model.py    the job's model, built as torchtitan's Trainer builds it
    compute.py  fwd+bwd timing of its layers, fit T = a*F + b
    memory.py   saved-for-backward and peak bytes, static account, BucketSize
    comm.py     all-gather / reduce-scatter latency, piecewise fit
    head.py     the cost per token outside the layers (token_us)
    checkpointing.py  compute and memory under each activation-checkpointing mode
    micro_batch.py  the fixed cost of one micro-batch
    step.py     what a step pays outside its micro-batches ([step] fixed_us)
    fit.py      the least-squares fits (plain Python)
    check.py    fill one rank to BucketSize and measure it
    check_chunked.py  a document trained in chunks (overlength = "chunk") against chunk_cost
    train_check.py  the same question asked of a real training run (torchrun)
    train_report.py its per-rank verdict: measured peak vs the profile's budget
    writer.py   the profile TOML and the console report
    plot.py     PNG of points vs fits
    ranks.py    process-group helpers: every rank measures, rank 0 writes
    cli.py      the command line (__main__.py runs it)
"""

from skrull_ext.profile.fit import PiecewiseFit, PolyFit, fit_piecewise, fit_poly
from skrull_ext.profile.options import ProfileOptions

__all__ = ["PiecewiseFit", "PolyFit", "ProfileOptions", "fit_piecewise", "fit_poly"]
