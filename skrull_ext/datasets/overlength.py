"""Over-length sequences, found before the first step.

A sequence longer than ``bucket_size * cp`` fits no CP group. The core
scheduler applies ``skrull.overlength`` per step (error, truncate, drop), but
an ``error`` found at step 700 wastes the run up to there. So at start-up the
trainer asks the data source for its length bound and, only when the bound
exceeds the limit, pre-scans the lengths of every global batch the run will
draw (sources give lengths without building tokens). ``error`` then fails
before training, naming the sample, its step, its length and the limit, in
the core's words; ``truncate`` and ``drop`` log how many sequences they will
cut, and the dataloader logs and counts each one as it happens.
"""

import time
from dataclasses import dataclass, field

from torchtitan.tools.logging import logger

from skrull_ext import _core


class OverlengthError(ValueError):
    """A sequence of the run is longer than a CP group can hold, under overlength = 'error'."""


@dataclass
class OverlengthScan:
    """What the pre-scan found for one run."""

    mode: str
    bucket_size: int
    cp: int
    first_step: int
    last_step: int
    bound: int | None
    """The source's length bound (None: unknown)."""
    scanned: int = 0
    """Sequences whose length was read (0 when the bound already fits)."""
    over: list[tuple[int, int, int]] = field(default_factory=list)
    """(step, sample index, length) of every over-length sequence."""
    seconds: float = 0.0

    @property
    def limit(self) -> int:
        return _core.max_sequence_length(self.bucket_size, self.cp)

    def message(self) -> str:
        """The first offender in the core scheduler's words, then the totals."""
        step, index, length = self.over[0]
        return (
            f"sample {index} (step {step}) has length {length}, longer than the {self.limit} tokens "
            f"a CP group can hold (bucket_size {self.bucket_size} x cp {self.cp}); raise "
            "skrull.bucket_size or parallelism.context_parallel_degree, lower dataloader.max_len, "
            "or set skrull.overlength to 'truncate' or 'drop' "
            f"({len(self.over)} of {self.scanned} sequences of steps {self.first_step}..{self.last_step} "
            "are over-length)"
        )


def scan_overlength(loader, bucket_size: int, cp: int, mode: str, first_step: int, last_step: int) -> OverlengthScan:
    """Lengths of steps ``first_step..last_step`` (1-based, inclusive) against the limit.

    ``loader`` provides ``length_bound()`` and ``step_lengths(step)``.
    """
    start = time.perf_counter()
    report = OverlengthScan(mode, bucket_size, cp, first_step, last_step, loader.length_bound())
    if report.bound is None or report.bound > report.limit:
        for step in range(first_step, last_step + 1):
            for index, length in loader.step_lengths(step):
                report.scanned += 1
                if length > report.limit:
                    report.over.append((step, index, length))
    report.seconds = time.perf_counter() - start
    return report


def check_overlength(loader, bucket_size: int, cp: int, mode: str, first_step: int, last_step: int) -> OverlengthScan:
    """Pre-scan, raise :class:`OverlengthError` under 'error', log the counts otherwise."""
    report = scan_overlength(loader, bucket_size, cp, mode, first_step, last_step)
    if report.over and mode == "error":
        raise OverlengthError(report.message())
    if report.over:
        verb = {"truncate": f"truncated to {report.limit} tokens", "drop": "dropped"}[mode]
        logger.warning(
            f"Skrull over-length: {len(report.over)} of {report.scanned} sequences of steps "
            f"{first_step}..{last_step} are longer than {report.limit} tokens and will be {verb} "
            f"(skrull.overlength = {mode!r}); first: sample {report.over[0][1]} "
            f"(step {report.over[0][0]}), length {report.over[0][2]}"
        )
    else:
        how = "by the source's bound" if report.scanned == 0 else f"scanned {report.scanned} in {report.seconds:.2f}s"
        logger.info(f"Skrull over-length: none in steps {first_step}..{last_step} (limit {report.limit}, {how})")
    return report
