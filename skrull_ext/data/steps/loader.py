"""The Skrull scheduling dataloader: one plan per global batch, one buffer
per (DP rank, CP rank) per micro-batch.

Every step, every rank draws the same global batch (sample
indices are a function of the step), applies the length limit to it (the
over-length mode ``skrull.overlength`` and the loss-token check,
overlength.py: what is cut or skipped is counted, accounting.py) from the
source's lengths and loss counts,
asks the scheduler for the plan of its lengths (the core is deterministic, so
every rank gets the same plan without talking) and builds its own buffers
from it: only the samples of its own micro-batches are ever built. A DP rank with fewer
micro-batches than the plan's maximum gets no-op pad micro-batches, so FSDP
ranks run the same number of passes; on the free-running timeline (``[skrull]
free_running``, or replicate-only DP under ``defer_grad_sync``: no per-pass
collective across DP ranks) it runs its own micro-batches only, and one pad
where it has none.
The loss normaliser, the number of loss tokens of the whole global batch, is
computed here from the plan: the same on every rank, so no all-reduce is
needed for it.

torchtitan builds dataloaders before it knows the CP layout, so the trainer
calls ``attach(scheduler, cp_rank, cp_size)`` once after construction; the
scheduler's resolved job (``scheduler.job``) says how the job executes.

With ``[skrull] lookahead`` W > 1 the steps come in windows of W: at a
window's first step the loader reads (draws and limits) the window's W global
batches and the core regroups their samples over the window's steps
(``Scheduler.lookahead``: each step keeps the number of samples that arrived
in it, none moves more than W-1 steps, the window's predicted time is
least); each step then plans and trains the samples given to it, and counts
them (a trained sample at the step that trains it, a skipped one at the step
it arrived in: accounting.by_training_step), so a run that stops inside a
window has counted what it trained. Each step's
loss is normalised by the window's mean loss tokens per step, not its own,
so a token weighs the same whichever step of the window it landed in
(docs/design/lookahead.md). Validation never looks ahead.

A step is a function of its number and of the run's counts before it
(``StepBuilder``); under look-ahead through its window's index, so a run
resumed inside a window re-plans the same window and trains the same
steps. With ``[dataloader] prefetch_steps`` K > 0 (the default 2) a
background thread builds steps t+1..t+K while step t trains
(prefetch.py says why a thread suffices); the steps are the same as built on
demand, and the checkpointed state is that of the last step handed to the
trainer, so a resume replays exactly the uninterrupted run. A step's warning
(its cut and skipped samples) is logged when it is handed out too, so steps
built ahead beyond ``training.steps`` say nothing.
"""

import copy
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.tools.logging import logger

from skrull_ext import _core
from skrull_ext.data.steps.accounting import RunAccount, StepAccount, by_training_step
from skrull_ext.data.steps.buffers import MicroBatchBuffer
from skrull_ext.data.steps.overlength import LengthLimit, cut, decide_lengths, loss_tokens, scheduler_limit, settle
from skrull_ext.data.steps.plan_buffers import rank_buffers
from skrull_ext.data.steps.prefetch import Prefetcher
from skrull_ext.data.steps.base import SourceDataLoaderBase
from skrull_ext.data.sources.synthetic import Sample
from skrull_ext.data.steps.windows import LookaheadWindow, Windows
from skrull_ext.errors import DataError
from skrull_ext.scheduler import Scheduler
from skrull_ext.scheduler.plan import Plan


@dataclass
class SkrullStep:
    """Everything one rank needs for one optimizer step."""

    step: int
    dp_rank: int
    samples: list[int]
    """Source indices of the samples trained this step (the global batch less
    the skipped ones), in plan (caller) order, then those trained in chunks (``chunked``)."""
    plan: Plan
    micro_batches: list[MicroBatchBuffer]
    """This rank's buffers: ``plan.slots`` of them (pads included), or under
    free-running its own micro-batches only (one pad if it has none)."""
    global_valid_tokens: int
    """Loss tokens of the whole global batch (all DP ranks, CP ranks, micro-batches)."""
    loss_tokens: float | None = None
    """What the step's summed token loss is divided by: ``global_valid_tokens`` (None sets
    it), or under look-ahead the window's loss tokens / its steps (every step of a window
    the same)."""
    window: "LookaheadWindow | None" = None
    """Under look-ahead: the step's window, what it did (the same on each of its steps)."""
    schedule_us: float = 0.0
    """Wall time this rank spent planning the step (core, CP-SAT, checks)."""
    build_us: float = 0.0
    """Wall time of the whole step's build (draw, limit, plan, buffers), on
    the prefetch thread when ``prefetch_steps`` > 0: what prefetch has to hide."""
    tokens: int = 0
    """Real tokens of the step over all ranks, its chunked samples' too (``last_tokens``):
    counted where the step is built, not where it is handed out (2 ms at 8,192 samples)."""
    account: StepAccount = field(default_factory=StepAccount)
    """Samples read, trained whole, cut, skipped this step (and why)."""
    totals: dict[str, int] = field(default_factory=dict)
    """The same counts since the run began (resumes included)."""
    source_totals: dict[str, dict[str, int]] = field(default_factory=dict)
    """A mixture's run counts per source (``totals`` by source)."""
    chunked: list[Sample] = field(default_factory=list)
    """Under ``overlength = "chunk"``: this rank's samples longer than the limit, whole, which
    the trainer runs in chunks before the micro-batches (train/chunked.py): those the plan assigns
    to this DP rank (``plan.chunked_group``), in the step's order."""

    def __post_init__(self) -> None:
        if self.loss_tokens is None:
            self.loss_tokens = self.global_valid_tokens

    @property
    def local_valid_tokens(self) -> int:
        return sum(mb.valid_labels for mb in self.micro_batches)

    @property
    def num_tokens(self) -> int:
        return sum(mb.num_tokens for mb in self.micro_batches)


def planned_and_chunked(limit: LengthLimit, kept: list[int], lengths: list[int], losses: list[int]
                        ) -> tuple[tuple[list[int], list[int], list[int]], list[tuple[int, int, int]]]:
    """A step's decided samples split into those its plan's micro-batches train (indices, lengths,
    loss tokens) and those ``overlength = "chunk"`` trains whole in chunks, each on one DP rank
    the plan picks (index, length, loss tokens): the one rule the loader builds steps by and
    start-up prices them by."""
    over = {k for k, m in enumerate(lengths) if m > limit.tokens}  # only under "chunk"
    if not over:
        return (kept, lengths, losses), []
    planned = tuple([x for k, x in enumerate(v) if k not in over] for v in (kept, lengths, losses))
    return planned, [(kept[k], lengths[k], losses[k]) for k in sorted(over)]


@dataclass(frozen=True)
class StepBuilder:
    """One rank's step as a function of the step number and the run's account
    so far (which it adds the step's counts to). Made by ``attach``; holds
    what a step needs and not the dataloader, so a prefetch thread running it
    does not keep the dataloader alive."""

    source: object
    scheduler: Scheduler
    limit: LengthLimit
    global_batch_size: int
    dp_rank: int
    cp_rank: int
    lockstep_passes: bool = False
    """Pad to the plan's slots even when the job runs free (validation's forward passes)."""
    warn: bool = True
    """Log each step's cuts and skips when the loader hands it out (a validation pass counts
    them in its own line)."""
    pin: bool = False
    """Stage the buffers in pinned memory (``MicroBatchBuffer.staged``): a CUDA trainer's."""
    token_multiple: int = 1
    """Each buffer padded to a multiple of this many tokens: the TP degree (buffers.pad_to_multiple)."""
    windows: Windows = Windows()
    """Which steps form each look-ahead window (``[skrull] lookahead``, across resumes that
    changed it: data/steps/windows.py); windows of 1 for validation."""
    _last: list = field(default_factory=list, compare=False, repr=False)
    """The last window made (at most one), reused by its other steps."""

    @property
    def own_only(self) -> bool:
        """Build only this rank's own micro-batches (one pad pass if it has none) where the job
        runs on the free-running timeline (``scheduler.job.timeline``, config.job_timeline: the
        ``free_running`` execution, one DP rank, or replicate-only DP under ``defer_grad_sync``),
        whose DP ranks share no collective per pass and whose plans are priced without pads.
        Otherwise pad to the plan's slots, so every rank runs as many FSDP passes."""
        return self.scheduler.job.timeline == _core.Timeline.FREE_RUNNING and not self.lockstep_passes

    def __call__(self, step: int, run: RunAccount) -> SkrullStep:
        begin = time.perf_counter()
        out = self._build(step, run)
        out.build_us = (time.perf_counter() - begin) * 1e6
        return out

    def window(self, step: int) -> LookaheadWindow:
        """The window holding ``step`` (1-based): its W global batches drawn and limited, their
        samples regrouped over its steps by the core (W > 1), each step's account by the step
        that trains a sample. A function of the window's index and the source, so every rank,
        and a resumed run, makes the same one."""
        span = self.windows.window(step)
        index, first, w = span.index, span.first, span.width
        if self._last and self._last[0].index == index:
            return self._last[0]
        samples, lengths, losses, accounts, chunked = [], [], [], [], []
        for s in range(first, span.last + 1):
            kept, n, c, account = decide_lengths(self.limit, self.source.global_batch(s, self.global_batch_size),
                                                 self.source, s)
            (kept, n, c), outside = planned_and_chunked(self.limit, kept, n, c)
            chunked.append(outside)
            samples.append(kept)
            lengths.append(n)
            losses.append(c)
            accounts.append(account)
        if w == 1:
            out = LookaheadWindow(index, first, w, samples, lengths, losses, accounts, chunked)
        else:
            a = self.scheduler.lookahead(lengths, [[n for _, n, _ in c] for c in chunked])
            flat = [(i, n, c) for b in range(w) for i, n, c in zip(samples[b], lengths[b], losses[b])]
            samples, lengths, losses = ([[flat[q][f] for q in members] for members in a.steps] for f in range(3))
            # A chunked sample trains at the step it arrived in: counted there, as its chunks are.
            regrouped = by_training_step(accounts, [samples[j] + [i for i, _, _ in chunked[j]] for j in range(w)],
                                         getattr(self.source, "source_name", None))
            for arrived, account in zip(accounts, regrouped):
                account.counts.chunked, account.counts.chunks = arrived.counts.chunked, arrived.counts.chunks
            out = LookaheadWindow(index, first, w, samples, lengths, losses, regrouped, chunked, a.moved,
                                  a.max_delay, a.window_us, a.arrival_window_us, a.elapsed_us)
        self._last[:] = [out]
        return out

    def _build(self, step: int, run: RunAccount) -> SkrullStep:
        win = self.window(step)
        j = step - win.first
        indices, lengths, losses = win.samples[j], win.lengths[j], win.losses[j]
        account = copy.deepcopy(win.accounts[j])  # a rebuilt step (resume, validation) counts afresh
        # Logged when the step is handed out (SkrullDataLoader.next_step): one built ahead may never train.
        settle(self.limit, account, run, step, len(indices) + len(win.chunked[j]), warn=False)
        start = time.perf_counter()
        # Each chunked document priced in the chunk the trainer runs it in (job.chunk_for, the memory rule's)
        plan = self.scheduler.schedule(lengths, dp_rank=self.dp_rank, chunked=[n for _, n, _ in win.chunked[j]])
        plan.validate(self.dp_rank)  # this rank's micro-batches in full, the rest's exactly-once and times
        schedule_us = (time.perf_counter() - start) * 1e6
        samples = _Samples(self.source, indices, lengths)
        trained = plan.trained
        valid = sum(  # the planned length is the limited one (the limit runs first); anything else is recounted
            (c if n == m else loss_tokens(self.source, i, n, self.source.length(i)))
            for i, m, c, n in ((indices[k], lengths[k], losses[k], plan.lengths[k]) for k in trained)
        )
        mbs = rank_buffers(plan, samples, indices, self.dp_rank, self.cp_rank, self.own_only, self.token_multiple)
        # Chunked samples: the whole CP group of the DP rank the plan assigns each to runs it, at
        # the length the limit kept (cut to dataloader.max_len beyond it: the RoPE cache's).
        chunked = [cut(self.source[i], n) for i, n, _ in (win.chunked[j][k] for k in plan.chunked_of(self.dp_rank))]
        valid += sum(c for _, _, c in win.chunked[j])
        if self.pin:
            mbs = [mb.staged() for mb in mbs]
        return SkrullStep(
            step=step, dp_rank=self.dp_rank, samples=indices + [i for i, _, _ in win.chunked[j]], plan=plan,
            micro_batches=mbs, chunked=chunked,
            global_valid_tokens=valid, loss_tokens=valid if win.width == 1 else win.loss_tokens,
            window=None if win.width == 1 else win, schedule_us=schedule_us, account=account,
            tokens=sum(plan.lengths[k] for k in trained) + sum(plan.chunked),  # plan.trained_lengths
            totals=run.totals.as_dict(), source_totals={n: c.as_dict() for n, c in run.by_source.items()},
        )


class _Samples(Sequence):
    """A step's kept samples, each built (and cut to its trained length) only
    when asked for: a rank builds the samples of its own micro-batches only."""

    def __init__(self, source, indices: list[int], lengths: list[int]) -> None:
        self.source, self.indices, self.lengths = source, indices, lengths

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> Sample:
        return cut(self.source[self.indices[k]], self.lengths[k])


class _Cursor:
    """Where step production stands: the last step built and the run's account
    after it. Each call builds the next step and returns it with a snapshot of
    that state (what the dataloader checkpoints once the step is handed out)."""

    def __init__(self, build: StepBuilder, step: int, account: RunAccount) -> None:
        self.build, self.step, self.account = build, step, account

    def __call__(self) -> tuple[SkrullStep, RunAccount]:
        self.step += 1
        out = self.build(self.step, self.account)
        return out, self.account.copy()


PREFETCH_MAX = 64
"""Most steps ``dataloader.prefetch_steps`` may build ahead (each holds one step's buffers)."""


class SkrullDataLoader(SourceDataLoaderBase):
    @dataclass(kw_only=True, slots=True)
    class Config(SourceDataLoaderBase.Config):
        prefetch_steps: int = 2
        """Steps built ahead on a background thread (draw, limit, plan, buffers) while the current one
        trains; 0: built when the trainer asks, on its thread. Same steps either way (data/steps/prefetch.py)."""

        def __post_init__(self):
            SourceDataLoaderBase.Config.__post_init__(self)
            k = self.prefetch_steps
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= PREFETCH_MAX:
                raise ValueError(f"dataloader.prefetch_steps: {k!r} is outside 0..{PREFETCH_MAX} "
                                 "(steps built ahead; 0 builds each step when asked)")

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer | None = None,
        **kwargs,
    ):
        super().__init__(config, tokenizer)
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self.scheduler: Scheduler | None = None
        self.cp_rank, self.cp_size = 0, 1
        self.limit: LengthLimit | None = None
        self.account = RunAccount(getattr(self.source, "names", ()))
        """The run's counts up to the last step handed out (checkpointed with ``step``; per source for a mixture)."""
        self.builder: StepBuilder | None = None
        self.windows: Windows | None = None
        """The run's look-ahead windows (set by ``attach``; checkpointed as ``lookahead``)."""
        self._resumed: Windows | None = None
        """The windows of the checkpoint this loader continues (``load_state_dict``), if any."""
        self._cursor: _Cursor | None = None
        self._ahead: Prefetcher | None = None
        self.hold_builds = False
        """The prefetch thread builds the next step only once ``resume_building`` is called (or the
        step after is asked for), not as soon as a step is handed out (SkrullTrainer sets it)."""

    def attach(self, scheduler: Scheduler, cp_rank: int, cp_size: int, pin: bool = False, tp: int = 1) -> None:
        """Bind the scheduler and this rank's CP coordinates (once, after build); how the
        job executes is the scheduler's resolved job's (``scheduler.job``). ``pin``: stage
        the buffers in pinned memory (a CUDA trainer). ``tp``: the TP degree, a multiple of
        which each buffer's length is padded to (buffers.pad_to_multiple)."""
        c = scheduler.job
        if (c.dp, c.cp) != (self.dp_world_size, cp_size):
            raise ValueError(
                f"scheduler is for DP {c.dp} x CP {c.cp}, this rank is in DP "
                f"{self.dp_world_size} x CP {cp_size}"
            )
        self.close()
        self.scheduler, self.cp_rank, self.cp_size = scheduler, cp_rank, cp_size
        self.limit = self.limit_of(c)
        self.windows = self._continue()
        self.builder = StepBuilder(self.source, scheduler, self.limit, self.config.global_batch_size,
                                   self.dp_rank, cp_rank, pin=pin, windows=self.windows, token_multiple=tp)

    def limit_of(self, job) -> LengthLimit:
        """The length limit this loader applies under ``job`` (attached or not)."""
        return scheduler_limit(job, self.config.max_len)

    def decided_lengths(self, job, step: int) -> list[int]:
        """1-based ``step``'s global batch as ``job``'s limit trains it in its plans' micro-batches
        (the lengths, no token built, nothing counted; a sample ``overlength = "chunk"`` trains in
        chunks is left out, as ``StepBuilder.window`` takes it out of the micro-batches): what
        start-up prices before the loader is attached (``decided_chunked``: the documents left out)."""
        return self._decided(job, step)[0][1]

    def decided_chunked(self, job, step: int) -> list[int]:
        """The lengths of 1-based ``step``'s chunked documents under ``job``'s limit (``overlength =
        "chunk"``; none otherwise): what start-up's look-ahead "auto" prices with the step, as the
        loader's windows do."""
        return [n for _, n, _ in self._decided(job, step)[1]]

    def _decided(self, job, step: int):
        limit = self.limit_of(job)
        kept, n, c, _ = decide_lengths(limit, self.source.global_batch(step, self.config.global_batch_size),
                                       self.source, step)
        return planned_and_chunked(limit, kept, n, c)

    def _continue(self) -> Windows:
        """The job's ``[skrull] lookahead`` windows, or after a resume the checkpoint's continued
        with it after ``step`` (data/steps/windows.py), said in one line when that changes them."""
        width, windows = self.scheduler.job.lookahead, self._resumed
        if windows is None:
            return Windows.of(width)
        out = windows.switch(self.step, width)
        if out != windows:
            logger.info(f"skrull.lookahead {width}: the checkpoint of step {self.step} has look-ahead windows "
                        f"{windows.describe()}; this run goes on with windows {out.describe()} (the window "
                        "holding the next step is finished as it was begun: docs/design/lookahead.md)")
        return out

    def __iter__(self) -> Iterator[SkrullStep]:
        if self.scheduler is None:
            raise RuntimeError("SkrullDataLoader.attach() was not called (SkrullTrainer does)")
        while True:
            yield self.next_step()

    def next_step(self) -> SkrullStep:
        """The step after the last one handed out. With ``prefetch_steps`` K > 0
        the first call starts a thread building the next K steps ahead; the
        loader's state (``step``, ``account``) moves only when a step is handed
        out. An error building a step is raised here, at that step, with the
        state as the synchronous path leaves it: that step counted as read
        (its samples were drawn and counted), the next call goes on after it."""
        if self.builder is None:
            raise RuntimeError("SkrullDataLoader.attach() was not called (SkrullTrainer does)")
        if self._cursor is None:
            self._cursor = _Cursor(self.builder, self.step, self.account.copy())
            if self.config.prefetch_steps:
                self._ahead = Prefetcher(self._cursor, self.config.prefetch_steps,
                                         name=f"skrull-prefetch-dp{self.dp_rank}-cp{self.cp_rank}")
        cursor, ahead = self._cursor, self._ahead
        try:
            out, account = ahead.get(hold=self.hold_builds) if ahead is not None else cursor()
        except BaseException as e:
            self.close()  # joins the thread: it stops at a failed step
            if ahead is None or e is ahead.failed:  # not, e.g., Ctrl-C while waiting for the thread
                self.step, self.account = cursor.step, cursor.account
            raise
        self.step, self.account = out.step, account
        if out.account.warning is not None and self.builder.warn:  # warned for the steps that train only
            logger.warning(out.account.warning)
        # Tokens of the step over all ranks, as the packed loader counts them (bench cp reads it),
        # and the step's chunked samples, every DP rank's (the plan lists them all).
        self.last_tokens = out.tokens
        return out

    def resume_building(self) -> None:
        """With ``hold_builds``: the prefetch thread may now build the step that replaces the
        one handed out last (the trainer calls it once that step's micro-batches are queued:
        prefetch.py ``Prefetcher.get``). No thread: nothing."""
        if self._ahead is not None:
            self._ahead.resume()

    def close(self) -> None:
        """Stop building ahead (joins the prefetch thread); the next step starts it again."""
        ahead, self._ahead, self._cursor = self._ahead, None, None
        if ahead is not None:
            ahead.close()

    def __del__(self) -> None:
        if getattr(self, "_ahead", None) is not None:
            self.close()

    def state_dict(self) -> dict:
        # The state after the last step handed out, not the prefetch thread's. The same on every rank
        # (a function of the global batches), so DCP keeps one copy and a resume may change the DP/CP
        # layout. The keys are those of torchtitan's batching (packed.py), whose 'stream' and 'documents'
        # packings carry pieces or whole sequences into the next step; Skrull never does, so
        # either batching continues the other's checkpoint (DCP loads the keys
        # of the fresh loader: a key one side lacked failed the resume).
        # "lookahead": the windows trained so far (data/steps/windows.py), so a resume with another
        # [skrull] lookahead finishes the window it stopped in. "data_order": what it fits (data_order.py).
        windows = self.windows or Windows()
        return {"step": self.step, "carry": "[]", "lookahead": windows.to_json(), **self.account.state_dict(),
                **self.order_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.close()  # steps built ahead of the old state are thrown away
        super().load_state_dict(state_dict)  # first: a checkpoint of other data is refused as such
        carry = json.loads(state_dict.get("carry", "[]"))
        if carry:
            raise DataError(
                f"the checkpoint of step {state_dict.get('step')} was packed by torchtitan's batching "
                f"(dataloader.packing 'stream' or 'documents') and carries {len(carry)} piece(s) of sequences into "
                "the next step, which Skrull batching cannot continue; continue it with --skrull.no-enable and "
                "the same --dataloader.packing")
        self.account.load_state_dict(state_dict)
        if (changed := self.account.batch_size_change(self.config.global_batch_size)) is not None:
            logger.warning(changed)
        # A checkpoint of torchtitan's batching has "[]": its steps were never regrouped.
        self._resumed = Windows.from_json(state_dict.get("lookahead", "[]"))
        if self.builder is not None:  # else attach continues them
            self.windows = self._continue()
            self.builder = replace(self.builder, windows=self.windows, _last=[])
