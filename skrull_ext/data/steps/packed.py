"""torchtitan-format batches of the sources' global batches (the baseline).

Samples are laid out in ``dp_world_size * local_batch_size`` rows of
``seq_len`` by ``[dataloader] packing`` (row_layout.py: each step's global
batch as whole samples, padded; the global batches as one stream cut
into full rows, carried across steps; or whole samples best-fit into the
rows, what does not fit carried); DP rank r gets rows [r*B, (r+1)*B). Each piece of a sample is a document (positions
restart at 0, which is where torchtitan's document mask separates them);
free space at a row's end is a padding document (id 0, label ignored), so it
never touches real tokens under the document mask. This is what torchtitan's
own trainer consumes, with one optimizer step per yielded batch: the gradient
accumulation steps of the run must be 1.

Samples longer than ``training.seq_len`` (or ``dataloader.max_len``) go
through the same over-length policy and accounting as Skrull's loader
(overlength.py); the policy is 'error' unless the trainer sets it
(``set_overlength``, from ``skrull.overlength``). Under 'stream' and
'documents' a sample is counted by the step that trains its last piece, not
the one that draws it (``_carried``). A checkpoint Skrull's look-ahead saved
inside a window is refused (``load_state_dict``): this batching would train
the window's samples at the steps they arrived in, some twice, others never.
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torchtitan.components.tokenizer import BaseTokenizer

from skrull_ext.data.steps.accounting import OVERLENGTH, Counts, Event, RunAccount, StepAccount, by_training_step
from skrull_ext.data.steps.overlength import apply_limit, cut, limit_step, location, refuse_empty, row_limit, settle
from skrull_ext.data.steps.row_layout import Piece, best_fit_rows, cut_stream, whole_rows
from skrull_ext.data.steps.base import SourceDataLoaderBase
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.data.steps.windows import Windows
from skrull_ext.errors import DataError


class PackedDataLoader(SourceDataLoaderBase):
    @dataclass(kw_only=True, slots=True)
    class Config(SourceDataLoaderBase.Config):
        pass

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer | None = None,
        seq_len: int,
        local_batch_size: int,
        **kwargs,
    ):
        super().__init__(config, tokenizer)
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.account = RunAccount(getattr(self.source, "names", ()))  # per source for a mixture
        self.last_samples: list[int] = []
        """Source indices trained by the last batch (what a failed step names)."""
        self.carry: list[Piece] = []
        """'stream' and 'documents' packing: pieces (source index, first, end token) drawn but not yet trained."""
        self.last_tokens = 0
        """Real (not padding) tokens of the last batch over all DP ranks."""
        self.last_counts = Counts()
        """What the last batch did with the samples it read (``skrull/samples_*``): under 'stream'
        and 'documents' those it finished training and those it skipped."""
        self.pending: dict[int, Event | None] = {}
        """'stream' and 'documents': carried samples, drawn but not finished, by source index, with
        their cut (None: whole); counted by the step that trains their last piece."""
        self.split = 0
        """'stream': samples finished this launch whose last piece starts inside them (cut across rows)."""
        self.on_layout: Callable[[list[list[Piece]]], None] | None = None
        """Called with each batch's rows over all DP ranks as it is built (the trainer counts
        their documents' FLOPs)."""
        self.training_step: Callable[[], int] | None = None
        """The trainer's step whose batch is being built (what a step's cut warning names):
        under 'stream' and 'documents' ``step`` counts the global batches drawn, several a
        step, and the trainer's step survives a resume without a key of this loader's.
        None (no trainer): ``step``."""
        self.set_overlength("error")

    def set_overlength(self, mode: str) -> None:
        """The over-length policy for samples longer than a row (or max_len)."""
        self.limit = row_limit(self.seq_len, mode, self.config.max_len)

    def check_rows(self, first_step: int, last_step: int) -> None:
        """Under 'rows' packing, refuse before step 1 a run in which some step's
        global batch (after the over-length limit) does not fit its rows, naming
        the step: found while training, it stopped the run after steps had
        trained. The same first-fit as ``_pack``, on lengths only."""
        if self.config.packing != "rows":
            return
        lim = self.limit
        for step in range(first_step, last_step + 1):
            lengths = [m for _, n in self.step_lengths(step) if (m := lim.kept_length(n)) is not None]
            try:
                whole_rows(lengths, self.dp_world_size * self.local_batch_size, self.seq_len)
            except ValueError as e:
                raise DataError(f"step {step} of {last_step}: {e}") from None

    def state_dict(self) -> dict:
        # The carry as one string: a checkpoint's keys must not depend on its length (DCP
        # loads into the keys of a fresh loader's state_dict).
        # "lookahead": Skrull's look-ahead windows (scheduling.py); this batching regroups none.
        return {"step": self.step, "carry": json.dumps(self.carry), "lookahead": "[]", **self.account.state_dict(),
                **self.order_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # first: a checkpoint of other data is refused as such
        step = self.step
        windows = Windows.from_json(state_dict.get("lookahead", "[]"))
        if (win := windows.window(step + 1)).first != step + 1:
            raise DataError(
                f"the checkpoint of step {step} was saved inside a look-ahead window (steps {win.first}..{win.last}, "
                f"skrull.lookahead {win.width}), whose samples Skrull batching regrouped over those steps; "
                "torchtitan's batching trains each global batch at its own step, so it would train some of them "
                f"twice and others never. Continue with Skrull batching (without --skrull.no-enable) to step {win.last} or beyond, "
                f"or continue this batching from a checkpoint saved where a window ends (step {win.last}, say)")
        self.account.load_state_dict(state_dict)
        self.carry = [tuple(p) for p in json.loads(state_dict.get("carry", "[]"))]
        self.pending = {}  # decided again from the source when the next step places them

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            yield self._pack()

    def _pack(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        B, S = self.local_batch_size, self.seq_len
        rows = self.dp_world_size * B
        if self.config.packing == "rows":
            indices = self.next_global_batch()
            self.last_samples, kept, account = limit_step(self.limit, indices, self.source, self.step, self.account)
            self.last_counts = account.counts
            samples = dict(enumerate(kept))
            layout = whole_rows([s.length for s in kept], rows, S)
        else:
            layout, samples = self._carried(rows, S)
        if self.on_layout is not None:
            self.on_layout(layout)
        self.last_tokens = sum(e - s for row in layout for _, s, e in row)
        inputs = torch.zeros(B, S, dtype=torch.long)
        labels = torch.full((B, S), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros(B, S, dtype=torch.long)
        for b, row in enumerate(layout[self.dp_rank * B : (self.dp_rank + 1) * B]):
            off = 0
            for k, start, end in row:
                n = end - start
                inputs[b, off : off + n] = samples[k].input[start:end]
                labels[b, off : off + n] = samples[k].labels[start:end]
                positions[b, off : off + n] = torch.arange(n)
                off += n
            positions[b, off:] = torch.arange(S - off)
        return {"input": inputs, "positions": positions}, labels

    def _carried(self, rows: int, S: int) -> tuple[list[list[Piece]], dict]:
        """'stream' and 'documents': the step's rows from the carried pieces and the
        global batches drawn while they hold fewer tokens than the rows (pieces keyed
        by source index); what the rows do not take is carried. 'stream' cuts them
        into full rows, 'documents' places them whole, best-fit decreasing.

        Counted is what the step trains, not what it draws: a sample when its last piece
        is in the rows (whole, or cut to the length limit), a skipped one when drawn
        (``by_training_step``, as Skrull's look-ahead counts). A carried sample is counted
        by the step that finishes it, so a checkpoint's counts hold no sample it carries."""
        samples = {}
        for k, _, end in self.carry:
            full = self.source[k]
            samples[k] = cut(full, end)
            if k not in self.pending:  # carried by the checkpoint this loader resumed: decided again
                self.pending[k] = None if end >= full.length else Event(
                    k, location(self.source, k), full.length, end, OVERLENGTH,
                    f"limit {self.limit.tokens}, {self.limit.source}")
        carried, drawn, have = list(self.carry), [], sum(e - s for _, s, e in self.carry)
        self.last_samples = list(dict.fromkeys(k for k, _, _ in self.carry))
        skipped = []
        while have < rows * S:
            indices = self.next_global_batch()
            kept_idx, kept, account = apply_limit(self.limit, indices, [self.source[i] for i in indices],
                                                  self.source, self.step)
            if not kept_idx:
                refuse_empty(f"global batch {self.step} (drawn for step {self._training_step()})", account)
            cuts = {e.index: e for e in account.events if e.kept}
            for k, s in zip(kept_idx, kept):
                samples[k] = s
                drawn.append((k, 0, s.length))
                have += s.length
                self.pending[k] = cuts.get(k)
            skipped += [e for e in account.events if not e.kept]
            self.last_samples += kept_idx
        if self.config.packing == "stream":
            layout, self.carry = cut_stream(carried + drawn, rows, S)
        else:
            layout, self.carry = best_fit_rows(carried, drawn, rows, S)
        done = [k for row in layout for k, start, end in row if end == samples[k].length]
        self.split += sum(start > 0 for row in layout for k, start, end in row if end == samples[k].length)
        events = [e for k in done if (e := self.pending.pop(k)) is not None] + skipped
        [account] = by_training_step([StepAccount(events=events)], [done],
                                     getattr(self.source, "source_name", None))
        settle(self.limit, account, self.account, self._training_step(), kept=None)
        self.last_counts = account.counts
        return layout, samples

    def _training_step(self) -> int:
        return self.step if self.training_step is None else self.training_step()
