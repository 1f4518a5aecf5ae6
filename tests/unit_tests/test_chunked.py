"""overlength = "chunk": a long document trained in chunks equals it trained in one pass.

The debug llama3 (fp32, CPU, dense DACP attention) trains one document of 251
tokens (8 chunks of 32, the last 27) chunked (skrull_ext/train/chunked.py)
and in one pass as a single local sequence of a micro-batch, what a
BucketSize of 251 or more gives. The summed token loss must agree within 1e-6
relative and every parameter's gradient within 1e-5 relative (its norm): at
CP 1 plain and with LoRA under torchtitan's full activation checkpointing (each
alone takes no path the two do not), and at CP 2 over 2 real gloo processes
(each chunk sharded over the pair, the last one padded; the ranks' losses and
gradients summed), with LoRA under full AC, the blocks compiled as a compiled job's
are, the chunks traced through them as chunk_path.py rules (the K/V all-gather a
functional collective in the trace), a bounded number of graphs that does not grow
with the chunks. (The plain model's chunks at CP 2: tests/integration_tests/test_chunk_dp_run.py's
DP 2 x CP 2 runs, held to one process.)

Memory: saved-tensor hooks count the bytes each chunk's forward saves for
backward. Apart from the K/V of its prefix (and the mask over it), a chunk
saves the same bytes whatever its index and whatever the document's chunk
count; with recompute, nothing but the chunks' K/V outlives the forward.
"""

import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from skrull_ext.attention import build_meta
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.models.registry import build_model_spec
from skrull_ext.train.chunked import attention_layers, chunk_bounds, chunked_loss
from tests.unit_tests.gloo_worker import gloo_group
from torchtitan_patches.dacp_attention import install_dacp_attention

LENGTH, CHUNK, VOCAB = 251, 32, 2048
LOSS_TOL, GRAD_TOL = 1e-6, 1e-5


def _model(lora: bool = False, ac: bool = False) -> torch.nn.Module:
    spec = build_model_spec("llama3", "debugmodel")
    if lora:
        from skrull_ext.lora import LoRAConfig, with_lora

        spec = with_lora(spec, LoRAConfig(enable=True, rank=4, alpha=8.0))
    torch.manual_seed(0)  # the same weights in every run and on every rank
    model = spec.model.build()
    model.init_states()
    if lora:  # LoRA's B starts at zero: give it values, or its gradients say little about A's
        for name, p in model.named_parameters():
            if ".lora_" in name:
                torch.nn.init.normal_(p, std=0.02)
    if ac:
        from torchtitan.distributed.activation_checkpoint import FullAC

        FullAC(FullAC.Config()).apply(model)
    install_dacp_attention([model], None, kernel="dense")
    return model


def _document(length: int = LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (length + 1,), generator=torch.Generator().manual_seed(1))
    labels = ids[1:].clone()
    labels[:7] = IGNORE_INDEX  # a prompt
    return ids[:-1], labels


def _loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def _grads(model) -> dict[str, torch.Tensor]:
    return {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
            for n, p in model.named_parameters() if p.requires_grad}


@functools.cache
def one_pass(lora: bool = False, ac: bool = False) -> tuple[float, dict]:
    """The document as one local sequence of a micro-batch (a BucketSize that holds it). Computed once
    per process and mode: the reference of the CP 1, CP 2, lockstep and compiled tests (read only)."""
    model = _model(lora, ac)
    tokens, labels = _document()
    meta = build_meta([LENGTH], [0], 0, 1)
    loss = _loss(model(tokens[None], positions=torch.arange(LENGTH)[None], attention_masks=meta), labels[None])
    loss.backward()
    return loss.item(), _grads(model)


def chunked(lora: bool = False, ac: bool = False, group=None) -> tuple[float, dict, int]:
    """The document in chunks, eager (over ``group``'s ranks); on one rank computed once per process and
    mode (``_chunked_here``: the CP 1 test's and the lockstep and compiled tests' reference, read only)."""
    return _chunked_here(lora, ac) if group is None else _chunked(lora, ac, group)


@functools.cache
def _chunked_here(lora: bool, ac: bool) -> tuple[float, dict, int]:
    return _chunked(lora, ac, None)


def _chunked(lora: bool, ac: bool, group) -> tuple[float, dict, int]:
    model = _model(lora, ac)
    tokens, labels = _document()
    out = chunked_loss(model, tokens, labels, CHUNK, _loss, group=group)
    out.loss.backward()
    return out.loss.item(), _grads(model), out.chunks


def _close(got: tuple[float, dict], ref: tuple[float, dict]) -> float:
    """Asserts the tolerances; returns the worst gradient's relative error."""
    (loss, grads), (ref_loss, ref_grads) = got, ref
    assert abs(loss - ref_loss) <= LOSS_TOL * abs(ref_loss), (loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    worst = 0.0
    for name, g in ref_grads.items():
        err = float((grads[name] - g).norm() / g.norm().clamp_min(1e-30))
        assert err <= GRAD_TOL, f"{name}: relative error {err:.2e}"
        worst = max(worst, err)
    return worst


def test_chunk_bounds_cover_the_document():
    assert chunk_bounds(LENGTH, CHUNK) == [(a, min(a + CHUNK, LENGTH)) for a in range(0, 256, CHUNK)]
    assert len(chunk_bounds(LENGTH, CHUNK)) == 8 and chunk_bounds(5, 8) == [(0, 5)]
    with pytest.raises(ValueError, match="chunk size"):
        chunk_bounds(5, 0)


@pytest.mark.parametrize("lora, ac", [(False, False), (True, True)], ids=["plain", "lora_full_ac"])
def test_chunked_equals_one_pass_cp1(lora, ac):
    loss, grads, n = chunked(lora, ac)
    assert n == 8
    _close((loss, grads), one_pass(lora, ac))


@pytest.mark.parametrize("tp, pads", [(2, 0), (4, 2)])
def test_chunk_shares_padded_to_the_tp_degree_equal_one_pass(tp, pads):
    """Under TP a rank's share of each chunk is a multiple of the TP degree, which sequence
    parallelism shards evenly (compiled blocks failed on an uneven shard): the document's last chunk
    (27 tokens) runs as 28, each lockstep pad chunk as ``tp`` tokens; the pads come after every real
    token, so the loss and gradients are one pass's. A chunk not a multiple of CP x TP is refused."""
    model = _model()
    tokens, labels = _document()
    seen = []
    hook = model.register_forward_pre_hook(lambda m, args: seen.append(args[0].size(1)))
    out = chunked_loss(model, tokens, labels, CHUNK, _loss, pad_chunks=pads, tp=tp)
    out.loss.backward()
    hook.remove()
    _close((out.loss.item(), _grads(model)), one_pass())
    assert set(seen) == {CHUNK, 28} | ({tp} if pads else set()), seen  # forwards and recomputations
    with pytest.raises(ValueError, match=r"chunk size 30 is not a multiple of the CP group's 1 ranks x TP 4"):
        chunked_loss(model, tokens, labels, 30, _loss, tp=4)


def test_chunk_size_must_split_over_the_group():
    class Two:  # a group of 2 ranks is only asked its size and rank first
        pass

    tokens, labels = _document()  # refused before the model is called: any module will do
    model = torch.nn.Identity()
    orig = dist.get_world_size, dist.get_rank
    dist.get_world_size, dist.get_rank = (lambda g=None: 2), (lambda g=None: 0)
    try:
        with pytest.raises(ValueError, match="chunk size 33 is not a multiple of the CP group's 2 ranks"):
            chunked_loss(model, tokens, labels, 33, _loss, group=Two())
    finally:
        dist.get_world_size, dist.get_rank = orig


# ------------------------------------------------------------------ CP 2, real gloo
def _worker(rank: int, store: str, outdir: str) -> None:
    """LoRA under full AC, each block compiled (aot_eager, fullgraph, wrapped as torchtitan orders AC and
    compile), the chunks traced as chunk_path.py rules for a compiled job at CP 2: a 4-chunk document,
    then the 8-chunk one, dynamo's graphs counted around each."""
    from skrull_ext.train.chunk_path import chunk_path

    with gloo_group(store, rank, 2):
        model = _model(lora=True, ac=True)
        for block in model.layers.values():
            block.compile(backend="aot_eager", fullgraph=True)
        counters = torch._dynamo.utils.counters
        traced = chunk_path(True).traced
        graphs = []
        for length in (4 * CHUNK - 5, LENGTH):
            model.zero_grad(set_to_none=True)
            before = counters["stats"]["unique_graphs"]
            tokens, labels = _document(length)
            out = chunked_loss(model, tokens, labels, CHUNK, _loss, group=dist.group.WORLD, traced=traced)
            out.loss.backward()
            graphs.append(counters["stats"]["unique_graphs"] - before)
        result = {"chunked": _summed(model, out), "traced": traced, "graphs": graphs}
        # The same document eager (an uncompiled job's chunks): every recompute, the chunk's checkpoint's
        # and torchtitan's full AC's of each block inside it, takes the K/V its forward gathered.
        layers = attention_layers([model])
        for m in layers:
            m.stats.reset()
        model.zero_grad(set_to_none=True)
        out = chunked_loss(model, *_document(), CHUNK, _loss, group=dist.group.WORLD, traced=False)
        out.loss.backward()
        result["eager"] = _summed(model, out)
        result["eager_counts"] = [sum(getattr(m.stats, k) for m in layers) for k in ("all_gathers", "replays")]
        torch.save(result, Path(outdir) / f"rank{rank}.pt")


def _summed(model, out) -> tuple[float, dict, int]:
    """The loss and gradients summed over the CP group (each rank's share of the document), the chunks."""
    grads = _grads(model)
    total = torch.tensor(out.loss.item(), dtype=torch.float64)
    dist.all_reduce(total)
    for g in grads.values():
        dist.all_reduce(g)
    return float(total), grads, out.chunks


@pytest.fixture(scope="module")
def cp2(tmp_path_factory) -> list[dict]:
    from tests.integration_tests import forked

    tmp = tmp_path_factory.mktemp("chunked_cp2")
    forked._context()  # the ranks fork from the warm forkserver (torch and torchtitan imported once)
    mp.start_processes(_worker, args=(str(tmp / "store"), str(tmp)), nprocs=2, start_method="forkserver")
    return [torch.load(tmp / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.mark.slow
def test_chunked_equals_one_pass_cp2(cp2):
    loss, grads, n = cp2[0]["chunked"]
    assert n == 8
    _close((loss, grads), one_pass(lora=True, ac=True))


@pytest.mark.slow
def test_eager_recomputes_take_the_forwards_kv_at_cp2(cp2):
    """Eager at CP 2 (LoRA under full AC): one all-gather a layer and chunk, the forward's; each
    recompute (the checkpointed chunks' and full AC's of every block) replays it (attention/prefix.py
    ``_exchange``), which the cost model prices (CostModel.chunk_regather false); one pass's loss and
    gradients."""
    layers = 6  # the debug llama3's
    for rank in cp2:
        loss, grads, n = rank["eager"]
        assert n == 8
        _close((loss, grads), one_pass(lora=True, ac=True))
        gathers, replays = rank["eager_counts"]
        assert gathers == layers * n  # before: each recompute gathered again
        assert replays == layers * (2 * (n - 1) + 1), replays  # chunks 1-7 twice (chunk, block), chunk 8 once


@pytest.mark.slow
def test_compiled_blocks_trace_chunks_at_cp2_graphs_bounded(cp2):
    """A compiled job's chunks at CP 2 run through the compiled blocks on every rank (the K/V
    all-gather a functional collective inside the trace: attention/prefix.py): the 4-chunk document
    compiles the chunk's graphs and the 8-chunk one after it none, so they do not grow with chunks."""
    print(f"graphs compiled, 4 chunks then 8, per rank: {[rank['graphs'] for rank in cp2]}")
    for rank in cp2:
        assert rank["traced"] is True
        first, then = rank["graphs"]
        assert 1 <= first <= 4 and then == 0, rank["graphs"]


# ------------------------------------------------------------------ memory
class SavedBytes:
    """Bytes each forward of ``model`` saves for backward, per call: saved-tensor hooks, each
    storage counted once, the parameters' own storage left out (kept whatever the schedule)."""

    def __init__(self, model) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.calls: list[dict[int, int]] = []
        self.handle = model.register_forward_pre_hook(lambda *_: self.calls.append({}))
        self.outside: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in self.params:
            (self.calls[-1] if self.calls else self.outside)[s.data_ptr()] = s.nbytes()
        return t

    def per_call(self) -> list[int]:
        return [sum(c.values()) for c in self.calls]

    def total(self) -> int:
        """Bytes of every storage saved, each once."""
        union = dict(self.outside)
        for c in self.calls:
            union.update(c)
        return sum(union.values())


def _saved(model, length: int, recompute: bool) -> tuple[SavedBytes, int]:
    """A forward only (nothing accumulates in ``model``, one built for every call); the counting hook
    removed after."""
    tokens, labels = _document(length)
    saved = SavedBytes(model)
    try:
        with saved.hooks:
            out = chunked_loss(model, tokens, labels, CHUNK, _loss, recompute=recompute)
    finally:
        saved.handle.remove()
    return saved, out.kv_bytes


def test_saved_bytes_flat_in_the_number_of_chunks():
    """Without recompute a chunk's forward saves the same bytes whatever the document's chunk
    count, growing from one chunk to the next by exactly the K/V (and the CPU kernel's mask) of
    the prefix's new chunk. With recompute (the schedule), what the forward keeps is the
    checkpoints' inputs, the K/V of chunks 0..n-3 (chunk n-2's feeds only the last chunk, which
    keeps its concatenation), and the last chunk's activations, kept as without recompute (its
    backward runs first: nothing to save by recomputing it), at 2, 4 or 8 chunks."""
    model = _model()
    attn = model.layers["0"].attention
    layers, kv_heads, head_dim = len(model.layers), attn.n_kv_heads, attn.head_dim
    kv = layers * 2 * kv_heads * CHUNK * head_dim * 4  # fp32 K and V of one chunk, every layer
    mask = layers * CHUNK * CHUNK * 4  # the dense mask's CHUNK more key columns (float on CPU)
    per_chunk = {n: _saved(model, n * CHUNK, recompute=False)[0].per_call() for n in (2, 4, 8)}
    assert per_chunk[8][:2] == per_chunk[2] and per_chunk[8][:4] == per_chunk[4]
    steps = [b - a for a, b in zip(per_chunk[8], per_chunk[8][1:])]
    assert steps == [kv + mask] * 7, (steps, kv, mask)
    for n in (2, 4, 8):
        saved, kv_bytes = _saved(model, n * CHUNK, recompute=True)
        assert kv_bytes == n * kv
        assert saved.total() == (n - 2) * kv + per_chunk[n][-1], (n, saved.total(), kv)


# ------------------------------------------------------------------ cost and memory model
def test_chunk_cost_moves_no_flops_and_prices_recompute():
    from skrull_ext.scheduler import cost_model
    from skrull_ext.scheduler.chunk_cost import RECOMPUTE_SHARE, chunk_cost

    m = cost_model.preset("llama3-debug")
    # A quadratic without a constant: the chunks' FLOPs add up to the document's.
    bounds = chunk_bounds(LENGTH, CHUNK)
    assert sum(m.flops(b) - m.flops(a) for a, b in bounds) == pytest.approx(m.flops(LENGTH), rel=1e-12)
    # Later chunks attend over more: each costs more than the one before.
    per = [m.flops(b) - m.flops(a) for a, b in bounds[:-1]]
    assert all(x < y for x, y in zip(per, per[1:]))
    c = chunk_cost(m, LENGTH, CHUNK)
    assert c.chunks == 8 and c.us > c.one_pass_us * (1 + RECOMPUTE_SHARE * 7 / 8) * 0.99
    # The last chunk keeps its activations: a document of one chunk costs its one pass exactly.
    one = chunk_cost(m, CHUNK, CHUNK)
    assert one.chunks == 1 and one.us == pytest.approx(one.one_pass_us, rel=1e-12)
    # The K/V the model predicts is what test_saved_bytes measured: 6 layers x 2 x 256 x 4 bytes a token.
    assert chunk_cost(m, 8 * CHUNK, CHUNK).kv_bytes == 6 * 2 * 256 * 4 * 8 * CHUNK
    # Over CP 2 each chunk's K/V is gathered in forward and its gradient reduce-scattered (comm_us), every
    # layer; a traced chunk's recompute gathers it again (the last chunk's is not recomputed), an eager
    # one's reuses the forward's (attention/prefix.py).
    v = m.kv_bytes(CHUNK)
    eager = chunk_cost(m, 8 * CHUNK, CHUNK, cp=2).us
    assert eager >= 6 * 8 * m.comm_us(v)
    traced = cost_model.hardware("h100-assumed").cost_model(cost_model.shape("llama3-debug"), chunk_regather=True)
    assert chunk_cost(traced, 8 * CHUNK, CHUNK, cp=2).us - eager == pytest.approx(6 * 7 * m.collective_us(v))
    with pytest.raises(ValueError, match="multiple of cp"):
        chunk_cost(m, LENGTH, 33, cp=2)


# ------------------------------------------------------------------ the loader under overlength = "chunk"
@pytest.mark.parametrize("lookahead", [1, 2])
def test_loader_hands_long_samples_whole_outside_the_plan(lookahead):
    from skrull_ext.data.steps.overlength import check_overlength, loss_tokens
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.scheduler import Scheduler, cost_model
    from skrull_ext.train.job.skrull_config import SkrullConfig

    config = SkrullDataLoader.Config(length_scale=32.0, max_len=2048, global_batch_size=8, vocab_size=VOCAB)
    loader = config.build(dp_world_size=1, dp_rank=0)
    section = SkrullConfig(bucket_size=256, cost_model="h100-assumed", overlength="chunk", lookahead=lookahead)
    loader.attach(Scheduler(section.scheduler_config(1, 1), cost_model.preset("llama3-debug")), 0, 1)
    report = check_overlength(loader, 1, 6)  # logs, neither refuses nor cuts
    steps = [loader.next_step() for _ in range(6)]
    src = loader.source
    long = [(i, n) for _, i, n in report.over]
    assert long and sorted((i, s.length) for st in steps for i, s in zip(st.samples[-len(st.chunked):], st.chunked)
                           if st.chunked) == sorted(long)
    for st in steps:
        assert max(st.plan.lengths) <= 256 and not st.plan.truncated and not st.plan.dropped
        c = st.account.counts
        assert (c.cut, c.skipped, c.chunked) == (0, 0, len(st.chunked))
        assert c.chunks == sum(-(-s.length // 256) for s in st.chunked)
        if lookahead == 1:  # the chunked samples' loss tokens are in the step's divisor
            assert st.global_valid_tokens == sum(loss_tokens(src, i, src.length(i), src.length(i))
                                                 for i in st.samples)
    assert steps[-1].totals["chunked"] == len(long) and steps[-1].totals["cut"] == 0


_CHUNK = ["--skrull.overlength", "chunk", "--dataloader.max_len", "2048", "--training.seq_len", "2048"]


@pytest.mark.parametrize("flags, world, message", [
    (["--skrull.overlength", "chunk", "--dataloader.max_len", "2048"], 1,
     "training.seq_len = 512: a chunked sample's positions run to its length: under skrull.overlength = 'chunk' "
     "set dataloader.max_len (now 2048)"),
    (_CHUNK + ["--skrull.no-enable"], 1, "skrull.overlength = 'chunk': needs skrull.enable = true"),
], ids=["rope", "packed"])
def test_chunk_refused_where_it_does_not_run_naming_the_key(flags, world, message, monkeypatch):
    from skrull_ext.errors import JobFileError
    from skrull_ext.train.job.job_file import load_config

    job = str(Path(__file__).parents[2] / "skrull_ext" / "jobs" / "debug_cpu.toml")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", job, *flags])
    assert message in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    load_config(["--config-file", job, *_CHUNK])  # the bar's run passes
    monkeypatch.setenv("WORLD_SIZE", "2")
    load_config(["--config-file", job, *_CHUNK, "--skrull.free_running"])  # DP 2, free-running
    load_config(["--config-file", job, *_CHUNK])  # DP 2, "auto": settled at start-up (train/settle.py)
    load_config(["--config-file", job, *_CHUNK, "--skrull.no-free_running"])  # DP 2 lockstep: padded passes
    load_config(["--config-file", job, *_CHUNK, "--compile.enable"])  # compiled: the chunks traced (train/chunk_path.py)
    load_config(["--config-file", job, *_CHUNK, "--parallelism.tensor_parallel_degree", "2"])  # TP 2


def test_chunk_cuts_at_max_len_and_chunks_only_past_what_the_ranks_hold():
    """Under 'chunk' dataloader.max_len is still the user's cut: a sample longer than it is cut to
    it (counted as cut) and trains in chunks only past what the ranks hold; a max_len below
    that is a plain cut, nothing chunked. (A sample past max_len kept whole ran past the
    RoPE cache: 'position_ids exceed max_valid_pos'.)"""
    from skrull_ext.data.steps.overlength import capacity_limit, decide
    from skrull_ext.scheduler.capacity import Capacity

    limit = capacity_limit(Capacity(256, 1), "chunk", 1000)
    assert (limit.tokens, limit.by, limit.max_len) == (256, "capacity", 1000)
    assert [limit.kept_length(n) for n in (200, 256, 800, 1000, 1500)] == [200, 256, 800, 1000, 1000]
    keep, lengths, _, account = decide(limit, [0, 1, 2], [200, 800, 1500], lambda k, n: n, None, 1)
    c = account.counts
    assert (keep, lengths) == ([0, 1, 2], [200, 800, 1000])
    # chunked: the 800 whole and the 1500 cut to 1000, each in 4 chunks of 256 (the cut one had gone uncounted)
    assert (c.read, c.whole, c.cut, c.skipped, c.chunked, c.chunks) == (3, 2, 1, 0, 2, 8)
    small = capacity_limit(Capacity(256, 1), "chunk", 100)
    assert (small.tokens, small.by, small.max_len) == (100, "max_len", None)
    assert [small.kept_length(n) for n in (50, 100, 300)] == [50, 100, 100]
    assert capacity_limit(Capacity(256, 1), "chunk", None).kept_length(5000) == 5000  # job_checks needs max_len
    # max_len at what the ranks hold: a cut, nothing in chunks (a 520-token record had trained whole, past the
    # shipped text job's max_len and RoPE cache of 512 at CP 2)
    equal = capacity_limit(Capacity(256, 2), "chunk", 512)
    assert (equal.tokens, equal.max_len, equal.kept_length(520)) == (512, 512, 512)
    _, lengths, _, account = decide(equal, [0, 1], [300, 520], lambda k, n: n, None, 1)
    c = account.counts
    assert lengths == [300, 512] and (c.whole, c.cut, c.chunked, c.chunks) == (1, 1, 0, 0)


def test_the_shipped_gpu_job_takes_chunk_as_shipped(monkeypatch):
    """The 0.5B GPU job (DP 2 x CP 4, compiled, free_running 'auto') with --skrull.overlength chunk
    passes the job checks: compile and 'auto' at DP > 1 were refused before any process."""
    from skrull_ext.train.job.job_file import load_config

    job = str(Path(__file__).parents[2] / "skrull_ext" / "jobs" / "qwen2_5_0_5b_gpu.toml")
    monkeypatch.setenv("WORLD_SIZE", "8")
    config = load_config(["--config-file", job, "--skrull.overlength", "chunk"])
    assert config.compile.enable and config.skrull.free_running == "auto"
    assert config.parallelism.context_parallel_degree == 4
