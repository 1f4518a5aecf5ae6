"""Where every sample read went: trained whole, trained cut, or skipped.

Each step's global batch is read in full; the length limit (the over-length
policy, overlength.py) and the loss-token check then decide, per sample:

- **whole**: trained as read;
- **cut**: truncated to the limit and trained (``skrull.overlength =
  "truncate"``);
- **skipped**: not trained: over the limit under ``"drop"``, or left with no
  loss token after the cut (a chat whose prompt alone passes the limit),
  which would otherwise add zero to the loss and its normaliser.

``read = whole + cut + skipped`` holds per step and per run (``check()``).
Each cut or skip is an ``Event`` naming the sample, where it came from
(``file:line`` for JSONL) and the reason; the dataloader logs them, the
trainer puts the counts in the step's console line and TensorBoard
(``skrull/samples_*``) and logs ``RunAccount.summary()`` at the end. The run
totals are part of the dataloader's checkpointed state, so a resumed run
reports the whole run, and beside it this launch's share (``RunAccount.launch``).

A mixture of sources (mixture.py) is also counted per source: each step's
``by_source`` and the run's, ``read = whole + cut + skipped`` for each, in
the summary, TensorBoard (``skrull/source/<name>/samples_*``) and the
checkpointed state.
"""

from dataclasses import dataclass, field, fields

OVERLENGTH = "over-length"
NO_LOSS = "no loss tokens"


@dataclass
class Event:
    """One sample cut or skipped."""

    index: int
    where: str
    """``path:line`` of a JSONL record, else ``sample N``."""
    length: int
    kept: int
    """Tokens trained (0: skipped)."""
    reason: str
    """OVERLENGTH or NO_LOSS."""
    detail: str
    """The limit and where it comes from, e.g. 'limit 512, dataloader.max_len'."""

    def __str__(self) -> str:
        what = f"cut {self.length} -> {self.kept} tokens" if self.kept else f"skipped ({self.length} tokens)"
        return f"{self.where}: {what}, {self.reason}"

    def describe(self) -> str:
        """``str(self)`` and the detail (the limit and where it comes from)."""
        return f"{self} ({self.detail})"


@dataclass
class Counts:
    """Samples read and what became of them."""

    read: int = 0
    whole: int = 0
    cut: int = 0
    skipped_overlength: int = 0
    skipped_no_loss: int = 0
    chunked: int = 0
    """Of ``whole`` and ``cut``: longer than the limit, trained in chunks (``skrull.overlength =
    "chunk"``): whole, or cut to ``dataloader.max_len`` (a cut one is in ``cut`` too)."""
    chunks: int = 0
    """The chunks those ``chunked`` samples ran as."""

    @property
    def skipped(self) -> int:
        return self.skipped_overlength + self.skipped_no_loss

    def check(self) -> None:
        """``read = whole + cut + skipped`` (an internal invariant)."""
        if self.read != self.whole + self.cut + self.skipped:  # checked under python -O too
            raise AssertionError(f"sample accounting broken: {self}")

    def add(self, other: "Counts") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class StepAccount:
    """What one step did with its global batch."""

    counts: Counts = field(default_factory=Counts)
    events: list[Event] = field(default_factory=list)
    by_source: dict[str, Counts] = field(default_factory=dict)
    """The same counts per source of a mixture (empty for one source)."""
    warning: str | None = None
    """The step's one warning line naming each cut or skip (overlength.settle), None if none."""

    def record(self, event: Event) -> None:
        self.events.append(event)
        if event.kept:
            self.counts.cut += 1
        elif event.reason == OVERLENGTH:
            self.counts.skipped_overlength += 1
        else:
            self.counts.skipped_no_loss += 1


def count_by_source(indices: list[int], account: StepAccount, name_of) -> dict[str, Counts]:
    """``account``'s counts split by the source (``name_of(index)``) of each sample read."""
    events = {e.index: e for e in account.events}
    out: dict[str, Counts] = {}
    for i in indices:
        c = out.setdefault(name_of(i), Counts())
        c.read += 1
        e = events.get(i)
        if e is None:
            c.whole += 1
        elif e.kept:
            c.cut += 1
        elif e.reason == OVERLENGTH:
            c.skipped_overlength += 1
        else:
            c.skipped_no_loss += 1
    return out


def by_training_step(arrived: list[StepAccount], trained: list[list[int]], name_of=None) -> list[StepAccount]:
    """A look-ahead window's accounts by the step that trains each sample, from its accounts by
    arrival step (``arrived[j]``: what step j's global batch read, cut and skipped) and the
    samples each step trains (``trained[j]``). A trained sample (whole or cut) is counted, and
    its cut named, at the step that trains it; a skipped one, trained by no step, at the step it
    arrived in. So a run that stops inside a window counts what it trained, and nothing it will
    not (scheduling.py); over a whole window the counts are the arrival ones. ``name_of``: a
    mixture's source of a sample (counted per source too)."""
    cuts = {e.index: e for a in arrived for e in a.events if e.kept}
    out = []
    for j, members in enumerate(trained):
        account = StepAccount()
        skipped = [e for e in arrived[j].events if not e.kept]
        for i in members:
            if i in cuts:
                account.record(cuts[i])
            else:
                account.counts.whole += 1
        for e in skipped:
            account.record(e)
        account.counts.read = len(members) + len(skipped)
        account.counts.check()
        if name_of is not None:
            account.by_source = count_by_source(list(members) + [e.index for e in skipped], account, name_of)
        out.append(account)
    return out


def source_metrics(step: dict[str, Counts], totals: dict[str, dict[str, int]]) -> dict[str, float]:
    """TensorBoard's ``skrull/source/<name>/samples_*`` (this step) and ``..._total`` (the run), per source."""
    out = {}
    for name, total in totals.items():
        now = step.get(name, Counts())
        for what, a, b in (("read", now.read, total["read"]), ("whole", now.whole, total["whole"]),
                           ("cut", now.cut, total["cut"]),
                           ("skipped", now.skipped, total["skipped_overlength"] + total["skipped_no_loss"])):
            out[f"skrull/source/{name}/samples_{what}"] = float(a)
            out[f"skrull/source/{name}/samples_{what}_total"] = float(b)
    return out


def sample_metrics(counts: Counts, totals: dict[str, int]) -> dict[str, float]:
    """TensorBoard's ``skrull/samples_*`` of one step (``counts``) and the run
    (``totals``: ``Counts.as_dict()``), the same tags under both batchings;
    ``truncated`` / ``dropped`` are the over-length policy's share of them."""
    out = {}
    for name, now, total in (("read", counts.read, totals["read"]), ("whole", counts.whole, totals["whole"]),
                             ("cut", counts.cut, totals["cut"]),
                             ("skipped", counts.skipped, totals["skipped_overlength"] + totals["skipped_no_loss"]),
                             ("skipped_no_loss", counts.skipped_no_loss, totals["skipped_no_loss"])):
        out[f"skrull/samples_{name}"], out[f"skrull/samples_{name}_total"] = float(now), float(total)
    out["skrull/truncated"], out["skrull/truncated_total"] = float(counts.cut), float(totals["cut"])
    out["skrull/dropped"], out["skrull/dropped_total"] = float(counts.skipped_overlength), \
        float(totals["skipped_overlength"])
    if totals.get("chunked"):  # overlength = "chunk": trained whole, in this many chunks each
        out["skrull/chunked"], out["skrull/chunked_total"] = float(counts.chunked), float(totals["chunked"])
        out["skrull/chunks_per_sample"] = float(totals["chunks"]) / totals["chunked"]
    return out


def _chunked(c: Counts) -> str:
    return f"{c.chunked} of them trained in chunks ({c.chunks} chunks, {c.chunks / c.chunked:.1f} per sample)"


class RunAccount:
    """Totals since the run began (resumes included) and the first event of each kind."""

    def __init__(self, sources: tuple[str, ...] | list[str] = ()) -> None:
        self.totals = Counts()
        self.first: dict[str, Event] = {}
        self.by_source: dict[str, Counts] = {name: Counts() for name in sources}
        """Totals per source of a mixture (named up front: they are checkpointed keys)."""
        self.loaded = Counts()
        """``totals`` as a resume loaded them (zero for a fresh run): this launch's counts are
        ``launch()``, the difference."""
        self.loaded_step = 0
        """The step a resume loaded (the loader's checkpointed ``step``; 0 for a fresh run)."""

    def launch(self) -> Counts:
        """This launch's counts: the totals less those a resume started from."""
        out = Counts()
        for f in fields(Counts):
            setattr(out, f.name, getattr(self.totals, f.name) - getattr(self.loaded, f.name))
        return out

    def add(self, step: StepAccount) -> None:
        step.counts.check()
        self.totals.add(step.counts)
        for name, c in step.by_source.items():
            c.check()
            self.by_source.setdefault(name, Counts()).add(c)
        for e in step.events:
            self.first.setdefault(("cut" if e.kept else "skipped") + ": " + e.reason, e)

    def copy(self) -> "RunAccount":
        """A snapshot (events are never changed once recorded, so shared)."""
        out = RunAccount(list(self.by_source))
        out.totals.add(self.totals)
        for name, c in self.by_source.items():
            out.by_source[name].add(c)
        out.first = dict(self.first)
        out.loaded.add(self.loaded)
        out.loaded_step = self.loaded_step
        return out

    def summary(self, span: str = "") -> str:
        """The totals (``span``, e.g. which steps they cover, right after them), the first event
        of each kind, and the per-source counts of a mixture."""
        t = self.totals
        line = (f"samples read {t.read} = trained whole {t.whole} + trained cut {t.cut} + skipped {t.skipped} "
                f"({t.skipped_overlength} over-length, {t.skipped_no_loss} with no loss tokens){span}")
        if t.chunked:
            line += f"; {_chunked(t)}"
        for kind, e in self.first.items():
            line += f"; {kind}, first {e.describe()}"
        if self.by_source:
            line += "; per source: " + ", ".join(
                f"{name} read {c.read} = {c.whole} whole + {c.cut} cut + {c.skipped} skipped"
                for name, c in self.by_source.items())
        return line

    def state_dict(self) -> dict[str, int]:
        out = {f"samples_{k}": v for k, v in self.totals.as_dict().items()}
        for name, c in self.by_source.items():
            out.update({f"source_{name}_samples_{k}": v for k, v in c.as_dict().items()})
        return out

    def load_state_dict(self, state: dict) -> None:
        for f in fields(Counts):
            setattr(self.totals, f.name, int(state.get(f"samples_{f.name}", 0)))
            for name, c in self.by_source.items():
                setattr(c, f.name, int(state.get(f"source_{name}_samples_{f.name}", 0)))
        self.loaded = Counts()
        self.loaded.add(self.totals)
        self.loaded_step = int(state.get("step", 0))  # the loader's state holds its step beside the counts

    def batch_size_change(self, global_batch_size: int) -> str | None:
        """A warning when the loaded checkpoint read another number of samples a step than
        ``global_batch_size`` (None when it read that, or nothing was loaded). Step ``s``
        reads the run's samples ``(s - 1) B .. s B - 1`` in one order, so continuing at
        another B trains some samples twice or never reaches others, with no error."""
        step, read = self.loaded_step, self.loaded.read
        start = step * global_batch_size
        if step < 1 or read == 0 or read == start:
            return None
        what = (f"samples {start}..{read - 1} are trained again" if start < read else
                f"samples {read}..{start - 1} are never trained")
        return (f"dataloader.global_batch_size = {global_batch_size}: the checkpoint of step {step} read {read} "
                f"samples ({read / step:g} a step), and the steps after it number theirs by the new size, so {what}; "
                f"continue with --dataloader.global_batch_size {read // step} to train each sample once")
