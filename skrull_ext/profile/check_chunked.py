# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Does the cost model hold for a document trained in chunks? Train one and measure.

``[skrull] overlength = "chunk"`` trains a document longer than the job's
limit whole, in chunks of at most the limit (skrull_ext/train/chunked.py), and
skrull_ext/scheduler/chunk_cost.py prices it: its time (each chunk's
forward over its prefix, the recomputed forward, the backward, one call's
fixed cost per chunk) and its bytes (one chunk's activations plus
``peak_bytes_beyond_chunk``, the document's K/V copies). This runs one such
document through ``chunked_loss``, the code the trainer runs, on the job's
own model, and compares:

- time: one forward+backward of the document (median of ``repeats``, on the
  profile's clock where this process can read it: process CPU time with one
  torch thread on CPU, else wall), against ``chunk_cost(...).us`` (its
  attention priced as the rectangle of pairs a masked SDPA computes when the
  job's kernel, which the profile was fitted on, computes every pair:
  ``dense_fit``). Passing means within ``max_time_error`` (the profiler's
  held-out bound, 15%),
- bytes: the peak tensor bytes above the step's start (``PEAK_METERS``: on
  CPU the allocator events torch's profiler records, on CUDA
  ``max_memory_allocated``), against the activation fit at one chunk
  (``ProfileMemory.activation``) + ``peak_bytes_beyond_chunk`` (the prefix's
  K/V copies, the mask over it at the fit's quadratic coefficient, one
  gradient of the trainable parameters). Passing means within 2% of it or
  under, the BucketSize check's rule (check.py),
- the budget: that peak against the activation budget (usable - static),
  the BucketSize check's other rule, reported beside the verdict but not
  part of it. At a chunk of the limit, BucketSize tokens a rank, whose
  activations alone fill the budget, the document's K/V come on top, so a
  chunked document of several BucketSizes is over it (the model predicts
  so too). The trainer instead picks the largest chunk whose prediction fits
  (scheduler/chunk_cost.py ``fitting_chunk``); ``--fit-chunk`` checks that one.

A reference row times one micro-batch of a single ``chunk``-token document
against the cost model's micro-batch price, so a chunked ratio can be read
against the model's own error at that size. One process: the chunk is held
whole by this rank (CP 1, the one-rank case of the trainer's layout); a
profile whose fixed cost per micro-batch was measured under FSDP (which this
process does not run) has it left out of both predictions, and the report
says so. A compiled job (``--compile.enable``) runs the chunks as the trainer
does at CP 1, through the compiled blocks (train/chunk_path.py).

    python -m skrull_ext.profile.check --config-file JOB.toml --profile P.toml [--chunked-lengths 4x]
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from skrull_ext._core import CostModel
from skrull_ext.profile.memory import PEAK_METERS, SavedBytes
from skrull_ext.profile.model import JobModel
from skrull_ext.profile.ranks import pick_clock, sync, time_call
from skrull_ext.scheduler.chunk_cost import chunk_cost
from skrull_ext.scheduler.model_shape import model_compiled
from skrull_ext.scheduler.profile_memory import ProfileMemory
from skrull_ext.train.chunk_path import chunk_path
from skrull_ext.train.chunked import attention_layers, chunked_loss, unsharded_param_bytes

__all__ = ["BYTES_TOLERANCE", "DENSE_KERNELS", "ChunkedCheck", "allocate_grads", "check_chunked", "check_reference",
           "dense_fit", "dense_kernel", "fixed_left_out", "format_chunked", "parse_chunked_lengths", "random_document"]

DENSE_KERNELS = ("dense", "segments")
"""Micro-batch kernels that compute every (query, key) pair of a sequence (one masked SDPA over it):
a profile fitted on one prices a chunk's attention by its rectangle (``chunk_cost``'s ``dense_fit``)."""

BYTES_TOLERANCE = 0.02
"""A measured peak may exceed its prediction by this fraction (check.py's ``fit_holds`` rule)."""


@dataclass(frozen=True)
class ChunkedCheck:
    """One chunked document (``chunk`` > 0) or the reference micro-batch (``chunks`` = 0)."""

    length: int
    chunk: int
    chunks: int
    """Chunks the document ran in; 0 for the reference row (one micro-batch of ``length`` tokens)."""
    clock: str
    measured_us: float
    predicted_us: float
    fixed_left_out_us: float
    """Fixed cost per call the profile prices that this process does not pay (FSDP's), times the calls."""
    measured_peak: float
    """Peak tensor bytes above the step's start (NaN for the reference row: check.py measures it)."""
    measured_saved: float
    """Bytes saved for backward during the forward (hooks): the K/V the chunks keep, once each."""
    predicted_peak: float
    chunk_activation: float
    """The profile's activation fit at one chunk."""
    beyond_chunk: float
    """chunk_cost's ``peak_bytes_beyond_chunk``: what a rank holds beyond that chunk."""
    kv_measured: float
    """The document's K/V the forward kept (``ChunkedLoss.kv_bytes``)."""
    kv_predicted: float
    activation_budget: float
    max_time_error: float

    @property
    def time_ratio(self) -> float:
        return self.measured_us / self.predicted_us

    @property
    def bytes_ratio(self) -> float:
        return self.measured_peak / self.predicted_peak

    @property
    def time_ok(self) -> bool:
        return abs(self.time_ratio - 1.0) <= self.max_time_error

    @property
    def bytes_ok(self) -> bool:
        return self.chunks == 0 or self.measured_peak <= self.predicted_peak * (1.0 + BYTES_TOLERANCE)

    @property
    def fits(self) -> bool:
        return self.chunks == 0 or self.measured_peak <= self.activation_budget

    @property
    def ok(self) -> bool:
        """The cost model holds: time and bytes within their bounds. ``fits`` is not part of it: a
        peak over the budget the model also predicts says the chunk (the limit, say) is too large
        for the document's K/V, not that the model is wrong (the trainer's chunk: ``--fit-chunk``)."""
        return self.time_ok and self.bytes_ok

    def as_dict(self) -> dict:
        return {**asdict(self), "time_ratio": self.time_ratio, "bytes_ratio": self.bytes_ratio, "ok": self.ok}


def parse_chunked_lengths(text: str, chunk: int) -> tuple[int, ...]:
    """``--chunked-lengths``: tokens ("8192") or multiples of the chunk ("4x"; the chunk is
    BucketSize unless ``--chunk`` says), comma-separated; "" or "0" for none. Each must be longer
    than the chunk (else it is not chunked)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part or part == "0":
            continue
        try:
            n = round(float(part[:-1]) * chunk) if part.endswith("x") else int(part)
        except ValueError:
            raise ValueError(f"--chunked-lengths: {part!r} is neither tokens (8192) nor a multiple of "
                             f"the chunk (4x)") from None
        if n <= chunk:
            raise ValueError(f"--chunked-lengths: {part} = {n} tokens is not longer than the chunk, "
                             f"{chunk} tokens: such a document is not chunked")
        out.append(n)
    return tuple(out)


def fixed_left_out(profile: dict, device: torch.device) -> float:
    """The profile's fixed cost per micro-batch when it was measured under FSDP (> 1 rank),
    which one process does not run; 0 otherwise."""
    fsdp = int(profile.get("meta", {}).get("micro_batch", {}).get("fsdp_degree", 1))
    return float(profile.get("micro_batch", {}).get("fixed_us", 0.0)) if fsdp > 1 else 0.0


def dense_kernel(kernel: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``[skrull] attention_kernel`` (what the profile's compute was fitted on), resolved
    for the device and dtype as the trainer resolves ``auto``, is one of DENSE_KERNELS."""
    from skrull_ext.attention.kernels import AUTO, auto_kernel_for

    return (auto_kernel_for(device, dtype) if kernel == AUTO else kernel) in DENSE_KERNELS


def dense_fit(jm: JobModel) -> bool:
    """``dense_kernel`` of the job model's kernel."""
    skrull = getattr(jm.config, "skrull", None)
    return dense_kernel(getattr(skrull, "attention_kernel", "auto"), jm.device, jm.dtype)


def random_document(jm: JobModel, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and labels of one ``length``-token document on the job model's device."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, jm.vocab_size, (length,), generator=g).to(jm.device)
    labels = torch.randint(1, jm.vocab_size, (length,), generator=g).to(jm.device)
    return ids, labels


def check_chunked(jm: JobModel, cost: CostModel, pm: ProfileMemory, length: int, chunk: int, *,
                  repeats: int = 1, seed: int = 0, max_time_error: float = 0.15,
                  fixed_skip_us: float = 0.0) -> ChunkedCheck:
    """Train one ``length``-token document in chunks of ``chunk`` with ``chunked_loss`` and compare
    its time and peak bytes with ``chunk_cost`` and the memory model. The first run is metered for
    bytes (and warms up); ``repeats`` more are timed. Parameter gradients are allocated before the
    meter starts, so the peak is the document's alone."""
    if not jm.dacp:
        raise ValueError("the chunked check needs the job's DACP attention (skrull.enable = true), "
                         "as overlength = 'chunk' does")
    if length > jm.max_len:
        raise ValueError(f"--chunked-lengths: {length} tokens is longer than the model's RoPE cache "
                         f"({jm.max_len}, training.seq_len)")
    ids, labels = random_document(jm, length, seed)
    layers = attention_layers([jm.model])
    loss_fn = lambda pred, lab: jm.loss_fn(pred, lab, in_checkpoint=True)[0]  # noqa: E731  (as passes.py)

    traced = chunk_path(model_compiled(jm.config)).traced  # the trainer's path

    def forward():
        return chunked_loss(jm.model, ids, labels, chunk, loss_fn, layers=layers, traced=traced)

    def run() -> None:
        forward().loss.backward()

    allocate_grads(jm)
    meter = PEAK_METERS[jm.device.type](jm.device)
    jm.model.zero_grad(set_to_none=False)
    meter.start()
    saved = SavedBytes(jm.model)
    with saved:
        out = forward()
    out.loss.backward()
    sync(jm.device)
    peak = meter.peak()
    kv = out.kv_bytes
    del out

    clock = pick_clock("auto", jm.device)
    us = statistics.median(_timed(run, jm, clock) for _ in range(max(1, repeats)))
    grads = sum(p.numel() * p.element_size() for p in jm.model.parameters() if p.requires_grad)
    c = chunk_cost(cost, length, chunk, mask_bytes_per_token2=pm.c, gradient_bytes=float(grads),
                   unsharded_bytes=unsharded_param_bytes([jm.model], jm.dtype.itemsize),
                   dense_fit=dense_fit(jm))
    act = pm.activation(chunk)
    return ChunkedCheck(
        length=length, chunk=chunk, chunks=c.chunks, clock=clock, measured_us=us,
        predicted_us=c.us - c.chunks * fixed_skip_us, fixed_left_out_us=c.chunks * fixed_skip_us,
        measured_peak=peak, measured_saved=float(saved.bytes), predicted_peak=act + c.peak_bytes_beyond_chunk,
        chunk_activation=act, beyond_chunk=c.peak_bytes_beyond_chunk, kv_measured=float(kv),
        kv_predicted=c.kv_bytes, activation_budget=pm.usable - pm.static, max_time_error=max_time_error,
    )


def check_reference(jm: JobModel, cost: CostModel, pm: ProfileMemory, tokens: int, *, repeats: int = 1,
                    seed: int = 0, max_time_error: float = 0.15, fixed_skip_us: float = 0.0) -> ChunkedCheck:
    """One micro-batch of a single ``tokens``-token document, timed against the cost model's
    price of it (layers x comp_us + token_us x tokens + the fixed cost): the model's own error at
    one chunk's size, to read a chunked ratio against."""
    buf = jm.buffer([tokens], seed=seed)

    def run() -> None:
        out = jm.model(buf["tokens"], buf["positions"], buf["attention_masks"])
        jm.loss_fn(out, buf["labels"])[0].backward()

    allocate_grads(jm)
    clock = pick_clock("auto", jm.device)
    run()  # warm-up
    us = statistics.median(_timed(run, jm, clock) for _ in range(max(1, repeats)))
    predicted = cost.shape.layers * cost.comp_us(cost.flops(tokens)) + cost.token_us * tokens \
        + cost.micro_batch_fixed_us - fixed_skip_us
    nan = float("nan")
    return ChunkedCheck(
        length=tokens, chunk=tokens, chunks=0, clock=clock, measured_us=us, predicted_us=predicted,
        fixed_left_out_us=fixed_skip_us, measured_peak=nan, measured_saved=nan, predicted_peak=pm.activation(tokens),
        chunk_activation=pm.activation(tokens), beyond_chunk=0.0, kv_measured=0.0, kv_predicted=0.0,
        activation_budget=pm.usable - pm.static, max_time_error=max_time_error,
    )


def allocate_grads(jm: JobModel) -> None:
    """Allocate every trainable parameter's gradient, so that no meter counts them."""
    for p in jm.model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


def _timed(run, jm: JobModel, clock: str) -> float:
    wall, cpu = time_call(run, jm.device, before=lambda: jm.model.zero_grad(set_to_none=False))
    return cpu if clock == "cpu" else wall


def format_chunked(rows: list[ChunkedCheck]) -> str:
    """One line per row: measured / predicted time and bytes, and the verdict."""
    mib = lambda v: f"{v / 2**20:.1f} MiB"  # noqa: E731
    ms = lambda v: f"{v / 1e3:.1f} ms"  # noqa: E731
    lines = []
    for r in rows:
        left = f" (less {ms(r.fixed_left_out_us)} of FSDP's fixed cost)" if r.fixed_left_out_us else ""
        if r.chunks == 0:
            lines.append(f"one micro-batch of {r.length} tokens (reference): time {ms(r.measured_us)} vs "
                         f"predicted {ms(r.predicted_us)}{left} = {r.time_ratio:.2f}x ({r.clock} clock; "
                         "the cost model's own error at one chunk, not a verdict)")
            continue
        lines.append(
            f"chunked {r.length} tokens ({r.chunks} chunks of {r.chunk}): time {ms(r.measured_us)} vs chunk_cost "
            f"{ms(r.predicted_us)}{left} = {r.time_ratio:.2f}x ({r.clock} clock); peak {mib(r.measured_peak)} vs "
            f"{mib(r.predicted_peak)} (chunk {mib(r.chunk_activation)} + beyond {mib(r.beyond_chunk)}) = "
            f"{r.bytes_ratio:.2f}x; K/V kept {mib(r.kv_measured)} vs {mib(r.kv_predicted)}; peak vs budget "
            f"{mib(r.activation_budget)}: {'fits' if r.fits else 'OVER (not the verdict)'} -> {'OK' if r.ok else 'FAILED'}")
    return "\n".join(lines)
