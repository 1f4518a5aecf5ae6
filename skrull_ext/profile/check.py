# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Is BucketSize honoured? Fill one rank to BucketSize and measure.

A buffer of exactly BucketSize tokens is packed from documents drawn from
the job's own length distribution (the last one cut to fit), the way a
Skrull plan fills its fullest rank. With the job's optimizer built and
stepped once (so parameters, gradients and optimizer state are all
allocated), one forward+backward of the whole model and loss runs under
both meters (memory.py). Passing means:

- the activation fit holds at BucketSize: the peak tensor bytes within 2%
  of, or under, what the profile predicts, and
- the bucket fits: that peak above the static state is within the
  activation budget the profile derived BucketSize from (usable - static).

The static state of this process is measured too (tensor bytes of
parameters, gradients, optimizer state) and compared with the account for
one unsharded rank; the FSDP-sharded account is the same formula divided
by the sharding degree.

The profiler runs this at the end of every profile; to re-check a written
profile in a fresh process (another document draw with ``--seed``):

    python -m skrull_ext.profile.check --config-file JOB.toml --profile P.toml

It then trains a document of several BucketSizes in chunks of BucketSize
(``overlength = "chunk"``: ``--chunked-lengths``, default 2x) and compares
its time and peak bytes with the cost model's ``chunk_cost``
(check_chunked.py); a chunked document that misses fails the check too.

``--train`` measures a real training run of the job instead (torchrun,
the profile's cost model and BucketSize; see train_check.py):

    python -m skrull_ext.profile.check --train --config-file JOB.toml --profile P.toml [job flags]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from skrull_ext.profile.check_chunked import parse_chunked_lengths
from skrull_ext.profile.memory import OPTIMIZER_STATES, PEAK_METERS, local_bytes, measure_step, optimizer_state_tensors
from skrull_ext.profile.model import DTYPES, JobModel
from skrull_ext.profile.ranks import reduce_floats
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.scheduler.profile_memory import ProfileMemory

__all__ = ["BucketCheck", "check_bucket", "check_profile", "fill_bucket"]


def fill_bucket(jm: JobModel, tokens: int, seed: int = 0) -> list[int]:
    """Document lengths from the job's length distribution summing to ``tokens``."""
    dl = jm.config.dataloader
    if hasattr(dl, "lengths"):
        import numpy as np

        from skrull_ext import lengths as shipped_lengths
        from skrull_ext.data.sources.synthetic import SyntheticSequences

        src = SyntheticSequences(lengths=np.asarray(shipped_lengths.load(dl.lengths, "dataloader.lengths"), dtype=np.int64), vocab_size=max(3, jm.vocab_size), seed=seed,
                                 length_scale=dl.length_scale, min_len=dl.min_len, max_len=dl.max_len)
        draw = src.length
    else:  # no length distribution in the job: a fixed mix of short and long
        mix = (64, 256, 1024)
        draw = lambda i: mix[i % len(mix)]  # noqa: E731
    docs, i = [], 0
    while sum(docs) < tokens:
        docs.append(min(draw(i), tokens - sum(docs)))
        i += 1
    return docs


@dataclass(frozen=True)
class BucketCheck:
    tokens: int
    docs: int
    longest_doc: int
    predicted_activation: float
    """Profile's activation bytes for ``tokens`` (what the fit describes)."""
    measured_saved: float
    measured_peak: float
    activation_budget: float
    """usable - static: what BucketSize was derived to fit into."""
    static_measured: float
    """Parameters + gradients + optimizer state of this process (unsharded)."""
    static_account_unsharded: float
    fit_holds: bool
    fits: bool

    @property
    def ok(self) -> bool:
        return self.fit_holds and self.fits

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _optimizer_state_bytes(jm: JobModel) -> tuple[float, object]:
    """Build the job's optimizer, step it once with zero gradients (weights
    restored after), and count the bytes of its state tensors; returns the
    optimizer too, so its state stays allocated during the check."""
    opt = jm.config.optimizer.build(model_parts=[jm.model])
    for p in jm.model.parameters():
        if p.grad is None and p.requires_grad:  # a frozen (LoRA base) parameter gets no state
            p.grad = torch.zeros_like(p)
    with torch.no_grad():
        saved = [p.detach().clone() for p in jm.model.parameters()]
        opt.step()
        for p, s in zip(jm.model.parameters(), saved):
            p.copy_(s)  # keep the weights the profile measured
    return float(local_bytes(optimizer_state_tensors(opt))), opt


def check_bucket(jm: JobModel, bucket_size: int, predict: Callable[[int], float], budget: float,
                 optimizer_states: int, seed: int = 0, fit_target: str = "peak") -> BucketCheck:
    """Fill one rank to ``bucket_size`` tokens, step, and compare with the
    profile: ``predict(tokens)`` is its activation bytes, ``budget`` the
    usable memory minus its static account. ``fit_target``: what the fit
    describes, the peak, or for profiles written before the fit was the peak
    (``meta.memory.fit_target = "saved"``) the bytes saved for backward."""
    if fit_target not in ("peak", "saved"):
        raise ValueError(f"meta.memory.fit_target must be 'peak' or 'saved', got {fit_target!r}")
    tokens = min(bucket_size, jm.max_len)
    docs = fill_bucket(jm, tokens, seed)
    optim_bytes, opt = _optimizer_state_bytes(jm)
    params = local_bytes(jm.model.parameters())  # this rank's shards (FSDP's DTensors)
    grads = local_bytes(p.grad for p in jm.model.parameters())
    elem = DTYPES[jm.config.training.dtype].itemsize
    n_params = sum(p.numel() for p in jm.model.parameters())
    n_trainable = sum(p.numel() for p in jm.model.parameters() if p.requires_grad)  # LoRA: adapters only

    meter = PEAK_METERS[jm.device.type](jm.device)
    point = measure_step(jm, docs, meter, seed)
    saved, peak = reduce_floats([point.saved, point.peak], "max", jm.device)
    del opt
    predicted = predict(tokens)
    return BucketCheck(
        tokens=tokens,
        docs=len(docs),
        longest_doc=max(docs),
        predicted_activation=predicted,
        measured_saved=saved,
        measured_peak=peak,
        activation_budget=budget,
        static_measured=float(params + grads + optim_bytes),
        static_account_unsharded=float((n_params + n_trainable * (1 + optimizer_states)) * elem),
        fit_holds=(peak if fit_target == "peak" else saved) <= predicted * 1.02,
        fits=peak <= budget,
    )


def check_profile(jm: JobModel, profile: dict, seed: int = 0) -> BucketCheck:
    """The check for a profile file's [memory] section."""
    pm = ProfileMemory.of(profile)
    states = max(OPTIMIZER_STATES[g.optimizer_name] for g in jm.config.optimizer.param_groups)
    target = profile.get("meta", {}).get("memory", {}).get("fit_target", "peak")
    return check_bucket(jm, pm.bucket_size, pm.activation, pm.usable - pm.static, states, seed, target)


def main(argv: list[str] | None = None) -> int:
    """python -m skrull_ext.profile.check --config-file JOB.toml --profile P.toml [--train]

    Re-measures a written profile's BucketSize in a fresh process, or with
    --train in a real training run (torchrun, one process per rank)."""
    import argparse
    import sys

    from skrull_ext.profile.model import build_job_model
    from skrull_ext.train.job.job_file import load_config
    from torchtitan_patches import logs

    logs.install()  # without torchtitan's warnings about its own defaults
    p = argparse.ArgumentParser(prog="python -m skrull_ext.profile.check", description=main.__doc__)
    p.add_argument("--config-file", required=True, help="the job TOML the profile was measured for")
    p.add_argument("--profile", required=True, help="the profile TOML to check (written by skrull_ext.profile)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's own choice)")
    p.add_argument("--seed", type=int, default=1, help="draws the documents that fill BucketSize (default 1)")
    p.add_argument("--train", action="store_true",
                   help="measure a training run of the job (flags not listed here go to the job)")
    p.add_argument("--nproc", type=int, default=0,
                   help="--train: processes (default: the profile's meta.job_world_size)")
    p.add_argument("--chunked-lengths", default="2x",
                   help="documents trained in chunks of BucketSize (overlength = 'chunk'), their time and peak "
                        "measured against chunk_cost: tokens or multiples of BucketSize, e.g. 16384,4x; '' for none "
                        "(default: %(default)s, the cheapest that has a prefix: it costs a few BucketSize checks)")
    p.add_argument("--chunk", type=int, default=0,
                   help="tokens per chunk of the chunked documents (default 0: the profile's BucketSize, what the "
                        "trainer chunks at on one rank)")
    p.add_argument("--fit-chunk", action="store_true",
                   help="train each chunked document in the chunk the trainer picks for it (the largest of at most "
                        "--chunk whose predicted peak fits the budget: scheduler/chunk_cost.py fitting_chunk, cp 1) "
                        "instead of --chunk itself")
    p.add_argument("--chunked-repeats", type=int, default=1,
                   help="timed runs of each chunked document after its metered one; the median is kept "
                        "(default: %(default)s)")
    p.add_argument("--max-time-error", type=float, default=0.15,
                   help="a chunked document fails when its time misses chunk_cost by more than this fraction "
                        "(the profiler's --max-held-out-error; default: %(default)s)")
    args, job_args = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    profile = Profile.load(args.profile).data
    if args.train:
        return _train(args, job_args, profile)
    config = load_config(["--config-file", args.config_file, *job_args])
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    longest = config.model_spec.model.max_seq_len
    if args.chunk < 0 or args.chunked_repeats < 1:
        p.error(f"--chunk must be >= 0 (0: BucketSize) and --chunked-repeats >= 1, got {args.chunk} and "
                f"{args.chunked_repeats}")
    try:
        lengths = parse_chunked_lengths(args.chunked_lengths, args.chunk or ProfileMemory.of(profile).bucket_size)
    except ValueError as e:
        p.error(str(e))
    if lengths and max(lengths) > longest:
        p.error(f"--chunked-lengths: {max(lengths)} tokens is longer than {config.model_spec.name} "
                f"{config.model_spec.flavor} supports ({longest}, its max_seq_len)")
    jm = build_job_model(config, device, longest)
    try:
        return _check(jm, args, profile, lengths)
    finally:
        jm.close()  # the one-rank process group the build made, if it made one


def _check(jm, args, profile: dict, lengths: tuple[int, ...]) -> int:
    """The BucketSize line and the chunked documents' rows, printed; the exit status."""
    c = check_profile(jm, profile, args.seed)
    target = profile.get("meta", {}).get("memory", {}).get("fit_target", "peak")
    mib = lambda v: f"{v / 2**20:.1f} MiB"  # noqa: E731
    print(f"BucketSize {c.tokens} tokens ({c.docs} docs, longest {c.longest_doc}): "
          f"{target} {mib(c.measured_peak if target == 'peak' else c.measured_saved)} vs fit "
          f"{mib(c.predicted_activation)}; peak {mib(c.measured_peak)} vs budget {mib(c.activation_budget)} "
          f"-> {'OK' if c.ok else 'FAILED'}", flush=True)
    chunked = _chunked(jm, args, profile, lengths)
    return 0 if c.ok and all(r.ok for r in chunked if r.chunks) else 1


def _chunked(jm, args, profile: dict, lengths: tuple[int, ...]) -> list:
    """The chunked documents' check (check_chunked.py), printed; [] when none is asked for or the
    job cannot train in chunks (said in one line)."""
    from skrull_ext.profile.check_chunked import check_chunked, check_reference, fixed_left_out, format_chunked
    from skrull_ext.scheduler.chunk_cost import fitting_chunk
    from skrull_ext.train.chunked import unsharded_param_bytes

    if not lengths:
        return []
    if not jm.dacp:
        print(f"chunked check: not run for {len(lengths)} document(s): the job does not train with Skrull "
              "(skrull.enable = false), and overlength = 'chunk' needs it")
        return []
    pm, cost = ProfileMemory.of(profile), Profile(profile, args.profile).cost_model()
    kw = {"repeats": args.chunked_repeats, "seed": args.seed, "max_time_error": args.max_time_error,
          "fixed_skip_us": fixed_left_out(profile, jm.device)}
    chunk = args.chunk or pm.bucket_size
    rows = [check_reference(jm, cost, pm, chunk, **kw)]
    print(format_chunked(rows), flush=True)
    grads = float(sum(q.numel() * q.element_size() for q in jm.model.parameters() if q.requires_grad))
    unsharded = unsharded_param_bytes([jm.model], jm.dtype.itemsize)
    for n in lengths:
        fit = fitting_chunk(cost, pm, n, chunk, gradient_bytes=grads, unsharded_bytes=unsharded) \
            if args.fit_chunk else chunk
        rows.append(check_chunked(jm, cost, pm, n, fit, **kw))
        print(format_chunked(rows[-1:]), flush=True)
    return rows


def _train(args, job_args: list[str], profile: dict) -> int:
    """torchrun the training-run check (train_check.py) and return its exit status."""
    import subprocess
    import sys

    nproc = args.nproc or int(profile.get("meta", {}).get("job_world_size", 1))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "skrull_ext.profile.train_check", "--profile", args.profile,
           "--config-file", args.config_file, *job_args]
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    raise SystemExit(main())
