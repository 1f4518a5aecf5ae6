"""Length limits: the one place a sample is cut or dropped for its length.

A sample is over-length when it is longer than the limit: the smaller of
what the batching holds (``bucket_size * cp`` tokens, a CP group, for Skrull;
a ``training.seq_len`` row for torchtitan's batching) and
``dataloader.max_len`` when set (an SFT max-length cut). Sources never cut at
load time (a synthetic source draws lengths at most ``max_len``, so nothing
of it is cut). ``decide`` applies ``skrull.overlength`` to each step's
global batch (error, truncate, drop), before the scheduler sees it, counts
what it did, and skips a sample left with no loss token (a chat whose prompt
alone passes the limit), which would otherwise be trained as zero
(accounting.py).

An ``error`` found at step 700 wastes the run up to there. So at start-up
the trainer asks the data source for its length bound and, only when the
bound exceeds the limit, pre-scans the lengths of every global batch the run
will draw (sources give lengths without building tokens). ``error`` then
fails before training, naming the record (``file:line`` for JSONL), the
sample, its step, its length and the limit; ``truncate`` and ``drop`` log how
many sequences they will cut, and the dataloader logs and counts each one as
it happens.

A BucketSize too small for the data is refused there too (``stub_refusal``):
when the limit is what Skrull's ranks hold and ``truncate`` or ``drop`` would
cut or drop more than half of the sequences the run reads, the run would
train on stubs (``--skrull.bucket_size 10`` cut 16 of 16 and trained). The
bound follows from the data, not a fixed number of tokens: the message names
the counts and the smallest ``bucket_size`` that keeps at least half whole.
A ``dataloader.max_len`` below that is the user's own cut and is kept.
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from torchtitan.tools.logging import logger

from skrull_ext.data.steps.accounting import NO_LOSS, OVERLENGTH, Event, RunAccount, StepAccount, count_by_source
from skrull_ext.data.sources.synthetic import IGNORE_INDEX, Sample
from skrull_ext.errors import DataError
from skrull_ext.scheduler.capacity import Capacity
from skrull_ext.scheduler.chunk_cost import ChunkTooLarge


class OverlengthError(DataError):
    """A sample of the run is longer than the limit, under overlength = 'error'."""


@dataclass(frozen=True)
class LengthLimit:
    """The longest sample a run trains, what sets it, and what happens to longer ones.
    Data, not a label: messages are written from these fields, never parsed back."""

    tokens: int
    mode: str
    """skrull.overlength: error, truncate, drop or chunk."""
    by: Literal["capacity", "row", "max_len"]
    """What sets ``tokens``: what Skrull's ranks hold (``capacity``), a ``training.seq_len`` row
    of torchtitan's batching, or ``dataloader.max_len``."""
    capacity: Capacity | None = None
    """Under ``by == "capacity"``: the job's ranks (``tokens`` is ``capacity.limit``)."""
    max_len: int | None = None
    """``dataloader.max_len`` at or above ``tokens`` (None: unset, or it is below): under 'chunk' the
    longest a sample trains, chunks and all; a longer one is cut to it (counted as cut), since a
    chunked sample's positions run to its length and the RoPE cache covers max_len only. At
    ``tokens`` itself nothing trains in chunks: every longer sample is cut to it. (Left unset
    there, such a sample had trained whole, past max_len and the cache.)"""
    chunk_for: Callable[[int], int] | None = field(default=None, compare=False, repr=False)
    """Under 'chunk': the chunk a sample of n tokens trains in (``SchedulerJob.chunk_for``, what the
    scheduler prices); None: ``tokens``."""

    @property
    def source(self) -> str:
        """Where ``tokens`` comes from, in the job's keys: 'bucket_size B x cp N' (a CP group; 'x dp D'
        too for the pool), 'training.seq_len S' (a row) or 'dataloader.max_len M'."""
        if self.by == "capacity":
            return self.capacity.label
        return f"{'training.seq_len' if self.by == 'row' else 'dataloader.max_len'} {self.tokens}"

    def kept_length(self, n: int) -> int | None:
        """The over-length rule on one length, the one place Python applies it (the core's twin
        is cpp/include/skrull/overlength.hpp): ``n`` within ``tokens``; beyond it ``tokens``
        under 'truncate', ``n`` cut to ``dataloader.max_len`` under 'chunk' (trained whole in
        chunks, a chunked document of the plan outside its micro-batches: the core's micro-batches
        never meet it), and None under 'drop' and 'error' (not trained; ``decide`` raises for
        'error', naming the sample)."""
        if n <= self.tokens:
            return n
        if self.mode == "chunk":  # within max_len: whole, in chunks; beyond it: cut to max_len
            return n if self.cut_to is None else min(n, self.cut_to)
        return self.cut_to  # 'truncate': tokens; 'drop', 'error': None

    @property
    def cut_to(self) -> int | None:
        """What a cut keeps: ``tokens`` under 'truncate'; under 'chunk' ``dataloader.max_len`` (None
        where unset: nothing is cut), ``tokens`` where max_len is under what the ranks hold (the
        user's own cut, no chunk); None under 'drop' and 'error', which cut nothing."""
        if self.mode == "truncate" or (self.mode == "chunk" and self.by == "max_len"):
            return self.tokens
        return self.max_len if self.mode == "chunk" else None

    @property
    def chunks_any(self) -> bool:
        """Whether a sample can train in chunks: 'chunk' where a cut, if any, keeps more than ``tokens``."""
        return self.mode == "chunk" and (self.cut_to is None or self.cut_to > self.tokens)

    def chunk(self, n: int) -> int:
        """Under 'chunk', the chunk a sample of ``n`` tokens trains in (``chunk_for``, else ``tokens``)."""
        return self.tokens if self.chunk_for is None or n <= self.tokens else self.chunk_for(n)

    def chunks(self, n: int) -> int:
        """Under 'chunk', the chunks (of ``chunk(n)``) a sample of ``n`` trains as (1: it fits)."""
        return max(1, -(-n // self.chunk(n)))

    def too_long(self) -> str:
        """Why a longer sample is refused, in the core scheduler's words for the CP limit."""
        if self.by == "max_len":
            return f"longer than {self.source}"
        if self.by == "capacity":
            return f"longer than the {self.tokens} tokens {self.capacity.holder} can hold ({self.source})"
        return f"longer than a row ({self.source})"

    def fix(self) -> str:
        if self.by == "max_len":
            return "raise dataloader.max_len, or set skrull.overlength to 'truncate' or 'drop'"
        if self.by == "capacity":
            return ("raise skrull.bucket_size or parallelism.context_parallel_degree, or set skrull.overlength "
                    "to 'chunk' (trained whole, in chunks), 'truncate' or 'drop'")
        return "raise training.seq_len, or set skrull.overlength to 'truncate' or 'drop'"


def _capped(limit: LengthLimit, max_len: int | None) -> LengthLimit:
    """``limit``, or ``dataloader.max_len`` when that is smaller (under 'chunk' a max_len that is
    not smaller still cuts: ``LengthLimit.max_len``)."""
    if max_len is not None and max_len < limit.tokens:
        return LengthLimit(max_len, limit.mode, "max_len")
    if max_len is not None and limit.mode == "chunk" and max_len >= limit.tokens:  # equal: a cut, nothing chunked
        return dataclasses.replace(limit, max_len=max_len)
    return limit


def row_limit(seq_len: int, mode: str, max_len: int | None) -> LengthLimit:
    """torchtitan's batching: a ``training.seq_len`` row, or ``dataloader.max_len`` when smaller."""
    return _capped(LengthLimit(seq_len, mode, "row"), max_len)


def capacity_limit(capacity: Capacity, mode: str, max_len: int | None) -> LengthLimit:
    """A Skrull run's limit: what its ranks hold (``capacity.limit``: a CP group, or the
    DP x CP world under a pool policy), or ``dataloader.max_len`` when smaller."""
    return _capped(LengthLimit(capacity.limit, mode, "capacity", capacity), max_len)


def scheduler_limit(job, max_len: int | None) -> LengthLimit:
    """The limit of a resolved job (``SchedulerJob``: its capacity, over-length mode and chunk)."""
    limit = capacity_limit(job.capacity, job.overlength, max_len)
    return dataclasses.replace(limit, chunk_for=job.chunk_for) if limit.by == "capacity" else limit


def location(source, index: int) -> str:
    """``file:line`` of the record behind sample ``index``, else ``sample N``."""
    where = getattr(source, "location", None)
    return where(index) if where is not None else f"sample {index}"


def _named(where: str, index: int, step: int, sep: str, unit: str = "step") -> str:
    """``file:line: sample I (step S)``, or ``sample I (step S)`` when the source has no records
    (``unit``: what ``step`` counts, a validation batch for the held-out set)."""
    return (f"{where}{sep}" if where and where != f"sample {index}" else "") + f"sample {index} ({unit} {step})"


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("ch", "sh", "s")) else "s")


def loss_counter(source) -> Callable[[int, int, int], int]:
    """``count(index, n, length)``: loss tokens of sample ``index`` (``length`` tokens)
    trained as its first ``n`` (label k predicts token k + 1): from the source without
    building tokens where it can say (``source.loss_tokens``), else from its labels.
    Resolved once for a step's samples (8,192 lookups a step at DP 128 x 64 otherwise)."""
    counted = getattr(source, "loss_tokens", None)
    if counted is not None:
        return lambda index, n, length: int(counted(index, n, length))
    return lambda index, n, length: int((source[index].labels[:n] != IGNORE_INDEX).sum())


def loss_tokens(source, index: int, n: int, length: int) -> int:
    """``loss_counter(source)`` for one sample."""
    return loss_counter(source)(index, n, length)


def cut(sample: Sample, n: int) -> Sample:
    """``sample``'s first ``n`` tokens (itself when it has no more)."""
    return sample if sample.length <= n else Sample(input=sample.input[:n], labels=sample.labels[:n])


def decide(limit: LengthLimit, indices: list[int], lengths: list[int], losses, source, step: int
           ) -> tuple[list[int], list[int], list[int], StepAccount]:
    """The one decision, on lengths and loss counts only: which samples of a
    step's global batch are trained and at what length, and the step's account.
    ``losses(k, n)``: loss tokens of the k-th sample trained as its first n.
    Returns the positions (in ``indices``) kept, their lengths and loss tokens.
    Raises OverlengthError under 'error' (the start-up pre-scan normally finds it first)."""
    account = StepAccount()
    account.counts.read = len(indices)
    keep, kept_len, kept_loss = [], [], []
    for k, (i, n) in enumerate(zip(indices, lengths, strict=True)):
        m = limit.kept_length(n)
        if m is None:
            where = location(source, i)
            if limit.mode == "error":
                raise OverlengthError(f"{_named(where, i, step, ': ')} has length {n}, {limit.too_long()}; "
                                      + limit.fix())
            account.record(Event(i, where, n, 0, OVERLENGTH, f"limit {limit.tokens}, {limit.source}"))
            continue
        loss = losses(k, m)
        if not loss:
            detail = (f"its first {limit.tokens} tokens ({limit.source}) hold none" if m < n
                      else "the record has none")
            account.record(Event(i, location(source, i), n, 0, NO_LOSS, detail))
            continue
        if m < n:
            account.record(Event(i, location(source, i), n, m, OVERLENGTH, f"limit {limit.tokens}, {limit.source}"))
        else:
            account.counts.whole += 1
        if m > limit.tokens:  # overlength = "chunk": in chunks (train/chunked.py), whole or cut to max_len
            account.counts.chunked += 1
            account.counts.chunks += limit.chunks(m)
        keep.append(k)
        kept_len.append(m)
        kept_loss.append(loss)
    account.counts.check()
    if (name_of := getattr(source, "source_name", None)) is not None:  # a mixture: counted per source too
        account.by_source = count_by_source(indices, account, name_of)
    return keep, kept_len, kept_loss, account


def apply_limit(limit: LengthLimit, indices: list[int], samples: list[Sample], source, step: int
                ) -> tuple[list[int], list[Sample], StepAccount]:
    """One step's global batch under the limit, its samples built: the samples
    to train (cut where the over-length mode says so, in read order) and the step's account."""
    keep, lengths, _, account = decide(
        limit, indices, [s.length for s in samples],
        lambda k, n: int((samples[k].labels[:n] != IGNORE_INDEX).sum()), source, step)
    return [indices[k] for k in keep], [cut(samples[k], n) for k, n in zip(keep, lengths)], account


def settle(limit: LengthLimit, account: StepAccount, run: RunAccount, step: int, kept: int | None,
            warn: bool = True) -> None:
    """One warning when the step cut or skipped samples (naming each; kept as
    ``account.warning`` and logged here when ``warn``), the counts added to the
    run's; a step left with nothing to train (``kept`` 0) is refused (None: its
    global batches were checked when drawn, ``refuse_empty``)."""
    if account.events:
        c, t = account.counts, run.totals
        account.warning = (
            f"Skrull step {step}: {c.cut} cut, {c.skipped} skipped of {c.read} samples read "
            f"(limit {limit.tokens}, {limit.source}; skrull.overlength = {limit.mode!r}): "
            f"{'; '.join(map(str, account.events))}; run so far: {t.cut + c.cut} cut, {t.skipped + c.skipped} skipped"
        )
        if warn:
            logger.warning(account.warning)
    run.add(account)
    if kept is not None and not kept:
        refuse_empty(f"step {step}", account)


def refuse_empty(where: str, account: StepAccount) -> None:
    """Refuse a global batch whose every sample was skipped (``where``: "step 3", say)."""
    raise DataError(f"{where}: every sample of the global batch was skipped, nothing to train "
                    f"({'; '.join(map(str, account.events))})")


def limit_step(limit: LengthLimit, indices: list[int], source, step: int, run: RunAccount
               ) -> tuple[list[int], list[Sample], StepAccount]:
    """torchtitan's batching: ``apply_limit`` on the step's samples, then
    ``settle`` (the warning, the run's counts, an empty step refused)."""
    kept, samples, account = apply_limit(limit, indices, [source[i] for i in indices], source, step)
    settle(limit, account, run, step, len(kept))
    return kept, samples, account


def decide_lengths(limit: LengthLimit, indices: list[int], source, step: int
                   ) -> tuple[list[int], list[int], list[int], StepAccount]:
    """Skrull's batching: ``decide`` from the source's lengths and loss counts, no token
    built (a rank builds only its own micro-batches' samples), nothing counted yet
    (``settle`` adds the account to the run's). Returns the sample indices kept, their
    trained lengths and loss tokens, the step's account."""
    length, count = source.length, loss_counter(source)
    lengths = [length(i) for i in indices]
    keep, kept_len, kept_loss, account = decide(
        limit, indices, lengths, lambda k, n: count(indices[k], n, lengths[k]), source, step)
    return [indices[k] for k in keep], kept_len, kept_loss, account


@dataclass
class OverlengthScan:
    """What the pre-scan found for one run."""

    limit: LengthLimit
    first_step: int
    last_step: int
    bound: int | None
    """The source's length bound (None: unknown)."""
    scanned: int = 0
    """Sequences whose length was read (0 when the bound already fits)."""
    over: list[tuple[int, int, int]] = field(default_factory=list)
    """(step, sample index, length) of every over-length sequence."""
    seconds: float = 0.0
    first_where: str = ""
    """Where the first offender comes from (``file:line`` of a JSONL record)."""
    cut: int = 0
    """Over-length sequences the limit cuts (to ``LengthLimit.cut_to``): every one under 'truncate',
    those longer than ``dataloader.max_len`` under 'chunk'."""
    no_loss: int = 0
    """Of ``cut``: those whose cut would hold no loss token (skipped)."""
    unit: str = "step"
    """What the scanned steps are (``loader.step_unit``: "validation batch" for the held-out set,
    whose over-length line said "steps 1..2", read as the run's first steps)."""

    def message(self) -> str:
        """The first offender (its record, sample, step and length) and the limit, then the totals."""
        step, index, length = self.over[0]
        return (
            f"{_named(self.first_where, index, step, ': ', self.unit)} has length {length}, "
            f"{self.limit.too_long()}; {self.limit.fix()} ({len(self.over)} of {self.scanned} sequences of "
            f"{_plural(self.unit)} {self.first_step}..{self.last_step} are over-length)"
        )


def scan_overlength(loader, first_step: int, last_step: int, limit: LengthLimit | None = None) -> OverlengthScan:
    """Lengths of steps ``first_step..last_step`` (1-based, inclusive) against ``limit``
    (default ``loader.limit``: before a loader is attached, start-up passes its job's).

    ``loader`` provides ``limit``, ``length_bound()``, ``step_lengths(step)`` and ``source``.
    """
    start = time.perf_counter()
    report = OverlengthScan(limit or loader.limit, first_step, last_step, loader.length_bound(),
                            unit=getattr(loader, "step_unit", "step"))
    if report.bound is None or report.bound > report.limit.tokens:
        for step in range(first_step, last_step + 1):
            for index, length in loader.step_lengths(step):
                report.scanned += 1
                if length > report.limit.tokens:
                    report.over.append((step, index, length))
    report.seconds = time.perf_counter() - start
    if report.over:
        report.first_where = location(loader.source, report.over[0][1])
        lim = report.limit
        if (keep := lim.cut_to) is not None:
            cut = [i for _, i, n in report.over if n > keep]
            has_loss = getattr(loader.source, "has_loss_within", None)
            report.cut = len(cut)
            report.no_loss = sum(not has_loss(i, keep) for i in cut) if has_loss else 0
    return report


def _bucket_keeping(capacity: Capacity, tokens: int) -> int:
    """The smallest bucket_size whose ranks (``capacity``'s CP group, or pool) hold ``tokens`` whole."""
    bucket = max(1, -(-tokens // capacity.ranks))
    while Capacity(bucket, capacity.cp, capacity.dp, capacity.pool).limit < tokens:
        bucket += 1
    return bucket


def stub_refusal(report: OverlengthScan) -> str | None:
    """Why a run is refused for cutting most of its data (None: it is not).

    The rule: under ``truncate`` or ``drop``, when the limit is what Skrull's ranks
    hold (``skrull.bucket_size`` x the ranks a sequence spans) and more than half of
    the sequences the pre-scan read are longer, the run is refused, naming the counts
    and the smallest bucket_size with which at most half would be."""
    lim = report.limit
    if lim.by != "capacity" or lim.mode in ("error", "chunk") or 2 * len(report.over) <= report.scanned:
        return None
    allowed = report.scanned // 2  # at most this many may stay longer than the limit
    need = sorted((n for _, _, n in report.over), reverse=True)[allowed]
    verb = "cut" if lim.mode == "truncate" else "drop"
    return (f"skrull.bucket_size = {lim.capacity.bucket_size} would {verb} {len(report.over)} of the "
            f"{report.scanned} sequences of {_plural(report.unit)} {report.first_step}..{report.last_step} (longer than "
            f"{lim.tokens} tokens, {lim.source}; skrull.overlength = {lim.mode!r}): the run would train on stubs. "
            f"A Skrull run refuses a BucketSize that {verb}s more than half of its sequences; bucket_size "
            f"{_bucket_keeping(lim.capacity, need)} keeps at least half whole (or raise "
            f"parallelism.context_parallel_degree, or cut on purpose with dataloader.max_len)")


def chunked_longest(report: OverlengthScan) -> int | None:
    """Under 'chunk', the longest sample the scan found that trains in chunks (None: none), its
    chunk found now: a document whose K/V leave no chunk room on a rank (``ChunkTooLarge``)
    stops the run at start-up, named, not at its step. The chunk never grows with the length
    (``fitting_chunk``), so the longest is the one to ask."""
    lim = report.limit
    if lim.mode != "chunk" or not report.over:
        return None
    kept = [(m, step, index) for step, index, n in report.over if (m := lim.kept_length(n)) and m > lim.tokens]
    if not kept:
        return None
    length, step, index = max(kept)
    try:
        lim.chunk(length)
    except ChunkTooLarge as e:
        where = report.first_where if (step, index) == report.over[0][:2] else ""
        raise OverlengthError(f"{_named(where, index, step, ': ')}, skrull.overlength = 'chunk' at "
                              f"{lim.source}: {e}") from None
    return length


def check_overlength(loader, first_step: int, last_step: int, limit: LengthLimit | None = None,
                     quiet: bool = False) -> OverlengthScan:
    """Pre-scan (``scan_overlength``), raise :class:`OverlengthError` under 'error' or when most
    sequences would be cut (``stub_refusal``), log the counts otherwise (``quiet``: only the
    refusals, for a check before the run's own)."""
    report = scan_overlength(loader, first_step, last_step, limit)
    lim = report.limit
    if report.over and lim.mode == "error":
        raise OverlengthError(report.message())
    if (refusal := stub_refusal(report)) is not None:
        raise OverlengthError(refusal)
    longest = chunked_longest(report)
    if quiet:
        return report
    if report.over:
        chunks = f"in chunks of {lim.tokens} tokens"
        if longest is not None and lim.chunk(longest) != lim.tokens:
            chunks = (f"in chunks of at most {lim.tokens} tokens, the longest ({longest}) in chunks of "
                      f"{lim.chunk(longest)}, what fits a rank's memory")
        verb = {"truncate": f"truncated to {lim.tokens} tokens", "drop": "dropped",
                "chunk": f"trained whole {chunks}"}[lim.mode]
        if lim.mode == "chunk" and not lim.chunks_any:
            verb = f"truncated to {lim.tokens} tokens, dataloader.max_len: none trains in chunks"
        elif lim.mode == "chunk" and report.cut:
            verb += (f"; {report.cut} of them, longer than dataloader.max_len {lim.max_len}, will be cut to it "
                     "first")
        if report.no_loss:
            verb += (f", but {report.no_loss} of them would keep no loss token (a prompt longer than the "
                     f"{'limit' if lim.mode == 'truncate' else 'cut'}) and will be skipped")
        step, index, length = report.over[0]
        logger.warning(
            f"Skrull over-length: {len(report.over)} of {report.scanned} sequences of {_plural(report.unit)} "
            f"{first_step}..{last_step} are longer than {lim.tokens} tokens ({lim.source}) and will be "
            f"{verb} (skrull.overlength = {lim.mode!r}); first: "
            f"{_named(report.first_where, index, step, ', ', report.unit)}, "
            f"length {length}"
        )
    else:
        how = "by the source's bound" if report.scanned == 0 else f"scanned {report.scanned} in {report.seconds:.2f}s"
        logger.info(f"Skrull over-length: none in {_plural(report.unit)} {first_step}..{last_step} "
                    f"(limit {lim.tokens}, {lim.source}; {how})")
    return report
