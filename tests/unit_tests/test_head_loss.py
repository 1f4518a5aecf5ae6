"""The head and the loss in chunks of tokens (train/head_loss.py) equal them unchunked.

The debug llama3 (fp32, CPU, dense DACP attention) runs one packed
micro-batch of several documents (positions restarting at each, some labels
ignored) with its head inside the model and torchtitan's CrossEntropyLoss,
then with the head skipped (``_skip_lm_head``) and ChunkedHeadLoss in chunks
that do not divide the micro-batch. The loss (sum over the tokens / the
global loss tokens) must agree within 1e-6 relative and every parameter's
gradient within 1e-5 relative (its norm): plain, with LoRA, under
torchtitan's full activation checkpointing, nested inside ``overlength =
"chunk"``'s checkpointed chunks (train/chunked.py), and forward only (validation).
A LoRA linear as the head, passed through the model's forward and applied per chunk
by the loss, against its own forward with the loss unchunked: the same bars, its
adapters' gradients among them; with dropout, each chunk's recompute draws the
forward's mask.

Memory: saved-tensor hooks count the bytes the head and loss keep for
backward on a 4,096-token micro-batch; chunked, they are the hidden states
and the labels, exactly, under a quarter of what the unchunked head keeps.

The chunks with their gradients computed in forward (``loss.head_backward =
"in_forward"``, train/head_grad.py), against the unchunked head, the same bars:
the packed micro-batch in chunks of 1, 37, 100, all of it and more (the layers'
gradients too), a loss scaled after the head's (grad_output 3.7), LoRA layers
(the plain head frozen) and full activation checkpointing, a head with a bias
over two rows with chunks across them, torchtitan's single-device autocast,
inside ``overlength = "chunk"`` (recomputed there, ``in_checkpoint``; right but
dearer without), forward only; what they keep for backward (the two
gradients, exactly); "auto", a forced mode and the refusal; the chunk's
assumed bytes and a profile of the other mode said.
"""

import pytest
import torch
from torchtitan.components.loss import CrossEntropyLoss

from skrull_ext.attention import build_meta
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.errors import JobFileError
from skrull_ext.profile.memory import SavedBytes
from skrull_ext.scheduler.profile_memory import ProfileMemory, derive_bucket_size
from skrull_ext.train.chunked import chunked_loss
from skrull_ext.train.head_loss import (ChunkedHeadLoss, HeadChunking, assumed_head_bytes_per_token,
                                        choose_chunk_tokens, resolve_chunking)
from tests.unit_tests.test_chunked import GRAD_TOL, LOSS_TOL, VOCAB, _grads, _model

DOCS = (61, 7, 130, 1, 53)  # one packed micro-batch of 252 tokens
CHUNK = 37  # divides nothing here: the last chunk is shorter
GLOBAL_TOKENS = 1000.0  # the step's loss tokens the loss is divided by


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = sum(DOCS)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (1, n), generator=g)
    labels = torch.randint(0, VOCAB, (1, n), generator=g)
    labels[0, ::9] = IGNORE_INDEX  # prompts and document ends
    positions = torch.cat([torch.arange(d) for d in DOCS])[None]
    return tokens, labels, positions


def _losses(chunk: int | None) -> tuple[CrossEntropyLoss | ChunkedHeadLoss, bool]:
    """(the loss, whether the model skips its head): None is today's unchunked head."""
    if chunk is None:
        return CrossEntropyLoss(CrossEntropyLoss.Config()), False
    return ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=chunk)), True


def _wire(model, loss) -> None:
    if isinstance(loss, ChunkedHeadLoss):  # what torchtitan's Trainer does for a ChunkedLossWrapper
        loss.set_lm_head(model.lm_head)
        model._skip_lm_head = True


def micro_batch(chunk: int | None, lora: bool = False, ac: bool = False) -> tuple[float, dict]:
    model = _model(lora, ac)
    loss_fn, _ = _losses(chunk)
    _wire(model, loss_fn)
    tokens, labels, positions = _batch()
    meta = build_meta(list(DOCS), [0] * len(DOCS), 0, 1)
    pred = model(tokens, positions=positions, attention_masks=meta)
    loss, _ = loss_fn(pred, labels, torch.tensor(GLOBAL_TOKENS), positions=positions)
    loss.backward()
    return loss.item(), _grads(model)


def _close(ref: tuple[float, dict], got: tuple[float, dict]) -> None:
    (l0, g0), (l1, g1) = ref, got
    assert abs(l1 - l0) <= LOSS_TOL * abs(l0), (l0, l1)
    assert g0.keys() == g1.keys()
    for name in g0:
        err = (g1[name] - g0[name]).norm() / g0[name].norm().clamp_min(1e-30)
        assert err <= GRAD_TOL, (name, float(err))


@pytest.fixture(scope="module")
def reference() -> tuple[float, dict]:
    return micro_batch(None)


@pytest.mark.parametrize("chunk", [CHUNK, 1, sum(DOCS)])
def test_packed_micro_batch_equals_unchunked(reference, chunk):
    """Chunks of 37 (7 chunks, the last 30), of one token, and of exactly the micro-batch. A larger
    chunk runs the loop as this last one does (one slice, ``per_row < seq`` false: the head unchunked);
    a chunk larger than the micro-batch with the head put back in the model:
    test_head_put_back_in_the_model_equals_unchunked."""
    _close(reference, micro_batch(chunk))


def test_lora_equals_unchunked():
    _close(micro_batch(None, lora=True), micro_batch(CHUNK, lora=True))


def test_activation_checkpointing_equals_unchunked():
    _close(micro_batch(None, ac=True), micro_batch(CHUNK, ac=True))


def test_forward_only_equals_unchunked():
    """Validation's path: no gradients, the chunks run without checkpointing."""
    out = []
    for chunk in (None, CHUNK):
        model = _model()
        loss_fn, _ = _losses(chunk)
        _wire(model, loss_fn)
        tokens, labels, positions = _batch()
        with torch.no_grad():
            pred = model(tokens, positions=positions, attention_masks=build_meta(list(DOCS), [0] * len(DOCS), 0, 1))
            out.append(loss_fn(pred, labels)[0].item())
    assert abs(out[1] - out[0]) <= LOSS_TOL * abs(out[0])


def test_inside_overlength_chunks_equals_unchunked():
    """overlength = "chunk" calls the loss inside each checkpointed chunk of a long document: the head's
    checkpoint nests in it, and the recompute adds no gradient twice."""
    tokens, labels, _ = _batch()
    results = []
    for chunk in (None, CHUNK):
        model = _model()
        loss_fn, _ = _losses(chunk)
        _wire(model, loss_fn)
        out = chunked_loss(model, tokens[0], labels[0], 64, lambda p, lab: loss_fn(p, lab)[0])
        out.loss.backward()
        results.append((out.loss.item(), _grads(model)))
    _close(*results)


@pytest.mark.parametrize("mode", ["recompute", "in_forward"])
def test_chunked_head_keeps_under_a_quarter(mode):
    """Bytes the head and loss save for backward on a 4,096-token micro-batch (saved-tensor hooks, each
    storage once, parameters left out): chunked, exactly the hidden states and the labels with the chunks
    recomputed; with their gradients computed in forward (train/head_grad.py), exactly the hidden states'
    gradient (tokens x dim float32) and the head's weight gradient (vocab x dim float32). Either is under
    a quarter of the unchunked head's (its float32 log-softmax alone is tokens x vocab x 4)."""
    tokens, dim = 4096, 256
    kept = {}
    for chunk in (None, 512):
        model = _model()
        loss_fn, _ = _losses(chunk)
        _wire(model, loss_fn)
        if chunk:
            loss_fn.set_head_backward(mode)
        g = torch.Generator().manual_seed(0)
        h = torch.randn(1, tokens, dim, generator=g).requires_grad_()
        labels = torch.randint(0, VOCAB, (1, tokens), generator=g)
        x = h * 1.0  # the norm's output: what the head's graph starts from
        with SavedBytes(model) as saved:
            loss, _ = loss_fn(x if chunk else model.lm_head(x), labels, torch.tensor(float(tokens)))
        kept[chunk] = saved.bytes
        loss.backward()
    # recompute: float32 hidden states, int64 labels, the float32 divisor (the step's loss tokens)
    want = {"recompute": tokens * dim * 4 + tokens * 8 + 4, "in_forward": tokens * dim * 4 + VOCAB * dim * 4}
    assert kept[512] == want[mode]
    assert kept[None] >= tokens * VOCAB * 4  # the float32 log-softmax of every token
    assert kept[512] * 4 < kept[None]


def test_job_key_and_refusals():
    from skrull_ext.train.job.job_file import base_config
    from skrull_ext.models.registry import build_model_spec

    config = base_config(build_model_spec("llama3", "debugmodel"))
    assert isinstance(config.loss, ChunkedHeadLoss.Config) and config.loss.chunk_tokens == 0
    with pytest.raises(ValueError, match=r"loss.chunk_tokens: -1 must be an integer >= 0"):
        ChunkedHeadLoss.Config(chunk_tokens=-1)
    with pytest.raises(ValueError, match=r"loss.chunk_bytes: 0 must be a positive integer"):
        ChunkedHeadLoss.Config(chunk_bytes=0)


def test_job_file_sets_the_key(tmp_path):
    from skrull_ext.train.job.job_file import load_job

    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n[loss]\nchunk_tokens = 96\n')
    assert load_job(str(job)).loss.chunk_tokens == 96
    job.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n[loss]\nchunk_tokens = "96"\n')
    with pytest.raises(JobFileError, match=r"loss.chunk_tokens: expected an integer"):
        load_job(str(job))


def test_chunk_from_the_memory_model():
    assert assumed_head_bytes_per_token(151936, 2) == 151936 * 16
    assert choose_chunk_tokens(1000.0, 64_000) == 64
    assert choose_chunk_tokens(1000.0, 10) == 1  # at least one token
    config = ChunkedHeadLoss.Config(chunk_bytes=1 << 20)
    assumed = resolve_chunking(config, 2048, 4)
    assert assumed.chunk_tokens == (1 << 20) // (2048 * 20) and "assumed" in assumed.why
    measured = resolve_chunking(config, 2048, 4, measured=2048.0)
    assert measured.chunk_tokens == 512 and measured.head_bytes_per_token == 2048.0
    forced = resolve_chunking(ChunkedHeadLoss.Config(chunk_tokens=100), 2048, 4, measured=2048.0)
    assert forced.chunk_tokens == 100 and "forced by loss.chunk_tokens" in forced.why
    from skrull_ext.scheduler.profile_file import Profile

    profile = Profile({"compute": {"a_us_per_flop": 1e-6, "b_us": 0.0}, "comm": {"bytes": [1], "us": [1.0]},
                       "memory": {"logits_bytes_per_token": 4096.0, "head_chunk_tokens": 256}}, "p.toml")
    same = resolve_chunking(config, 2048, 4, profile)
    assert same.chunk_tokens == 256 and "measured by the profile p.toml" in same.why and "holds" not in same.why
    other = resolve_chunking(ChunkedHeadLoss.Config(chunk_tokens=100), 2048, 4, profile)
    assert "the profile's BucketSize holds chunks of 256 tokens" in other.why
    assert HeadChunking(100, 2048.0, "x").line(250).startswith(
        "head and loss in chunks of up to 100 tokens, 3 chunks for the largest micro-batch (250 tokens: the job's "
        "BucketSize)")


def test_the_chunk_line_says_the_chunk_is_a_bound_and_what_the_largest_micro_batch_runs_in():
    """The README's job read "chunks of 89229 tokens" for micro-batches of at most 256: the chunk
    is an upper bound, and the line says how many the BucketSize's micro-batch runs in."""
    big = HeadChunking(89229, 0.023 * 2**20, "the most whose peak fits loss.chunk_bytes 2048 MiB")
    assert big.line(256) == ("head and loss in chunks of up to 89229 tokens, 1 chunk for the largest micro-batch "
                             "(256 tokens: the job's BucketSize) (0.023 MiB a token at the peak; the most whose peak "
                             "fits loss.chunk_bytes 2048 MiB)")
    rows = HeadChunking(48, 2**20, "forced by loss.chunk_tokens").line(1024, "local_batch_size x seq_len / cp")
    assert rows.startswith("head and loss in chunks of up to 48 tokens, 22 chunks for the largest micro-batch "
                           "(1024 tokens: local_batch_size x seq_len / cp) (1.000 MiB")
    assert big.line() == ("head and loss in chunks of up to 89229 tokens (0.023 MiB a token at the peak; the most "
                          "whose peak fits loss.chunk_bytes 2048 MiB)")


def test_bucket_size_grows_by_the_logits():
    """BucketSize: the logits take one chunk's bytes, not a micro-batch's (exact small cases)."""
    usable, a, logits = 1e9, 1e4, 1e4
    assert derive_bucket_size(usable, 0, a + logits, 0, 0.0) == 50_000  # today: the logits in a
    assert derive_bucket_size(usable, 0, a, 0, 0.0, logits_bytes_per_token=logits, head_chunk_tokens=1000) == 99_000
    # a chunk larger than what fits: no micro-batch is chunked, the logits count per token
    assert derive_bucket_size(usable, 0, a, 0, 0.0, logits_bytes_per_token=logits, head_chunk_tokens=60_000) == 50_000
    assert derive_bucket_size(usable, 0, a, 0, 0.0, logits_bytes_per_token=logits, head_chunk_tokens=10**6) == 50_000


def test_profile_memory_keys_old_and_new():
    old = {"memory": {"bucket_size": 100, "a_bytes_per_token": 10.0, "b_bytes": 5.0, "usable_bytes": 1e4,
                      "static_bytes": 0.0}}
    mem = ProfileMemory.of(old)
    assert (mem.logits, mem.head_chunk) == (0.0, 0) and mem.activation(100) == 1005.0
    assert "logits_bytes_per_token" not in mem.section()  # an old profile writes back as it was
    new = ProfileMemory.of({"memory": {**old["memory"], "logits_bytes_per_token": 3.0, "head_chunk_tokens": 40}})
    assert mem.activation(30) + 90.0 == new.activation(30)
    assert mem.activation(100) + 120.0 == new.activation(100)
    assert new.section()["head_chunk_tokens"] == 40
    with pytest.raises(ValueError, match=r"memory.head_chunk_tokens must be a positive integer, got 0"):
        ProfileMemory.of({"memory": {**old["memory"], "head_chunk_tokens": 0}})


def test_head_put_back_in_the_model_equals_unchunked(reference):
    """One chunk holds every micro-batch: the head goes back into the model's forward (where its
    FSDP unit expects it; free-running DP ranks mismatched their reduce-scatters otherwise) and
    the loss takes the logits: the same loss and gradients, and DP ranks may run free again."""
    model = _model(False, False)
    loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=10 * sum(DOCS)))
    _wire(model, loss_fn)
    assert loss_fn.free_running_blocked is not None and "chunks of 2520 tokens" in loss_fn.free_running_blocked
    loss_fn.put_head_back([model])
    assert model._skip_lm_head is False and loss_fn.head_in_model and loss_fn.free_running_blocked is None
    tokens, labels, positions = _batch()
    pred = model(tokens, positions=positions, attention_masks=build_meta(list(DOCS), [0] * len(DOCS), 0, 1))
    assert pred.shape[-1] == VOCAB  # the logits
    loss, _ = loss_fn(pred, labels, torch.tensor(GLOBAL_TOKENS))
    loss.backward()
    _close(reference, (loss.item(), _grads(model)))


@pytest.mark.parametrize("lora", [False, True])
def test_head_passed_through_equals_unchunked(reference, lora):
    """Several chunks with the head module called in the model's forward (its FSDP unit's hooks in
    step) and its weight applied per chunk: the same loss and gradients. A head with its own
    forward (LoRA's wrapper) is left as it is and called from the loss."""
    model = _model(lora, False)
    loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=CHUNK))
    _wire(model, loss_fn)
    plain = type(model.lm_head).forward is torch.nn.Linear.forward
    assert loss_fn.pass_head_through([model]) is plain
    assert loss_fn.free_running_blocked is None if plain else "chunks of 37 tokens" in loss_fn.free_running_blocked
    assert model._skip_lm_head is not plain
    tokens, labels, positions = _batch()
    pred = model(tokens, positions=positions, attention_masks=build_meta(list(DOCS), [0] * len(DOCS), 0, 1))
    assert pred.shape[-1] == model.lm_head.in_features  # the hidden states, passed through or head skipped
    loss, _ = loss_fn(pred, labels, torch.tensor(GLOBAL_TOKENS))
    loss.backward()
    if not lora:
        _close(reference, (loss.item(), _grads(model)))


def _lora_head_model(lora_cls, dropout: float = 0.0) -> torch.nn.Module:
    """The debug llama3 with [lora]'s adapters in its layers and a LoRA linear as its head (``lora_cls``:
    skrull_ext's DropoutLoRALinear, or torchtitan's own LoRALinear without dropout), every adapter's B
    drawn non-zero so the gradients of A say something (test_chunked._model)."""
    from skrull_ext.lora import LoRAConfig, with_lora
    from skrull_ext.models.registry import build_model_spec
    from tests.integration_tests.lora_head_job import lora_head
    from torchtitan_patches.dacp_attention import install_dacp_attention

    lora = LoRAConfig(enable=True, rank=4, alpha=8.0)
    spec = with_lora(build_model_spec("llama3", "debugmodel"), lora)
    spec.model.lm_head = lora_head(spec.model.lm_head, lora, lora_cls, **({"dropout": dropout} if dropout else {}))
    torch.manual_seed(0)
    model = spec.model.build()
    model.init_states()
    for name, p in model.named_parameters():
        if ".lora_" in name:
            torch.nn.init.normal_(p, std=0.02)
    install_dacp_attention([model], None, kernel="dense")
    return model


def _lora_head_classes():
    from skrull_ext.lora.converter import DropoutLoRALinear, _LoRALinear

    return [DropoutLoRALinear, _LoRALinear]


def _forward_loss(model, loss_fn, seed: int = 5) -> tuple[float, dict]:
    tokens, labels, positions = _batch()
    pred = model(tokens, positions=positions, attention_masks=build_meta(list(DOCS), [0] * len(DOCS), 0, 1))
    torch.manual_seed(seed)  # the head's dropout masks, drawn in the loss's chunks
    loss, _ = loss_fn(pred, labels, torch.tensor(GLOBAL_TOKENS))
    loss.backward()
    return loss.item(), _grads(model)


@pytest.mark.parametrize("lora_cls", _lora_head_classes(), ids=lambda c: c.__name__)
def test_lora_head_passed_through_equals_its_own_forward(lora_cls):
    """A LoRA linear as the head, in chunks of 37: the model calls the head module, which passes the
    hidden states through (its FSDP unit's hooks in step), and the loss applies base weight + adapters
    per chunk (lora_linear, the module's own computation): the loss and every gradient, the head's
    lora_a and lora_b among them, are those of the LoRA head's own forward in the model with the loss
    on the whole micro-batch's logits; DP ranks may run free with it."""
    reference = _lora_head_model(lora_cls)
    want = _forward_loss(reference, CrossEntropyLoss(CrossEntropyLoss.Config()))
    assert {"lm_head.lora_a.weight", "lm_head.lora_b.weight"} <= want[1].keys()
    assert "lm_head.weight" not in want[1]  # the base head frozen

    model = _lora_head_model(lora_cls)
    loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=CHUNK))
    _wire(model, loss_fn)
    assert loss_fn.free_running_blocked is not None  # called from the loss, several times a micro-batch
    assert loss_fn.pass_head_through([model]) and loss_fn.free_running_blocked is None
    assert model._skip_lm_head is False
    _close(want, _forward_loss(model, loss_fn))


def test_lora_head_dropout_passed_through_draws_its_masks_once():
    """The LoRA head's dropout (0.3) in chunks: each chunk's recompute in backward replays the RNG state
    of its forward, so it draws the mask the forward drew. Against the head module called on each chunk
    in turn from the same seed, without checkpointing (the same masks, kept): the same loss and
    gradients. The chunks also pass validation's eval mode without dropout (forward only)."""
    from skrull_ext.lora.converter import DropoutLoRALinear

    reference = _lora_head_model(DropoutLoRALinear, dropout=0.3)
    reference._skip_lm_head = True
    cross_entropy = CrossEntropyLoss(CrossEntropyLoss.Config())

    def per_chunk(h, labels, global_tokens):
        parts = [cross_entropy(reference.lm_head(h[:, a:a + CHUNK]), labels[:, a:a + CHUNK])[0]
                 for a in range(0, h.shape[1], CHUNK)]
        return sum(parts) / global_tokens, {}

    want = _forward_loss(reference, per_chunk)
    model = _lora_head_model(DropoutLoRALinear, dropout=0.3)
    loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=CHUNK))
    _wire(model, loss_fn)
    assert loss_fn.pass_head_through([model])
    got = _forward_loss(model, loss_fn)
    _close(want, got)
    # The masks were drawn: the head's adapter gradients move by about sqrt(p / (1 - p)) = 0.65 of their
    # norm against the head without dropout (0.65-0.68 on torch 2.11 and 2.13). The loss moves by only
    # 6e-5 to 2e-4 (B drawn at std 0.02), too little to tell a mask from the torch version's init draws.
    undropped = _forward_loss(_lora_head_model(DropoutLoRALinear), CrossEntropyLoss(CrossEntropyLoss.Config()))
    assert got[0] != undropped[0]
    for name in ("lm_head.lora_a.weight", "lm_head.lora_b.weight"):
        change = float((got[1][name] - undropped[1][name]).norm() / undropped[1][name].norm())
        assert change > 0.3, (name, change)

    model.eval()  # validation: no dropout, the chunks unchecked; the LoRA head's own forward, unchunked
    reference.eval()
    reference._skip_lm_head = False
    with torch.no_grad():
        tokens, labels, positions = _batch()
        meta = build_meta(list(DOCS), [0] * len(DOCS), 0, 1)
        got = loss_fn(model(tokens, positions=positions, attention_masks=meta), labels)[0].item()
        want = cross_entropy(reference(tokens, positions=positions, attention_masks=meta), labels)[0].item()
    assert abs(got - want) <= LOSS_TOL * abs(want)


def test_a_head_of_its_own_forward_is_called_from_the_loss():
    """A head whose forward is not in HEAD_FORWARDS stays as it is, called from the loss per chunk; DP ranks
    keep lockstep with it, and the reason names the head."""

    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2.0 * super().forward(x)

    loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=CHUNK))
    loss_fn.set_lm_head(Scaled(4, 8))
    assert not loss_fn.pass_head_through([]) and not loss_fn.head_passes_through
    assert "the head (Scaled) runs in chunks of 37 tokens" in loss_fn.free_running_blocked



# ---- head_backward = "in_forward" (train/head_grad.py): each chunk's gradients computed in the loss's forward

def in_forward_batch(chunk: int | None, lora: bool = False, ac: bool = False, scale: float = 1.0,
                     mode: str = "in_forward") -> tuple[float, dict]:
    """The packed micro-batch as the trainer runs it (the head passed through the model's forward, its
    weight applied per chunk), the chunks in ``mode``; ``scale`` multiplies the loss after the head's
    (grad_output = scale); None: today's unchunked head, the loss scaled the same."""
    model = _model(lora, ac)
    tokens, labels, positions = _batch()
    meta = build_meta(list(DOCS), [0] * len(DOCS), 0, 1)
    if chunk is None:
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
    else:
        loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=chunk))
        _wire(model, loss_fn)
        assert loss_fn.pass_head_through([model])
        loss_fn.set_head_backward(mode)
    pred = model(tokens, positions=positions, attention_masks=meta)
    loss, _ = loss_fn(pred, labels, torch.tensor(GLOBAL_TOKENS))
    (loss * scale).backward()
    return loss.item(), _grads(model)


@pytest.mark.parametrize("chunk", [CHUNK, 1, sum(DOCS)])
def test_in_forward_equals_unchunked(reference, chunk):
    """Chunks of 37 (balanced: 7 of 36), of one token, and of exactly the micro-batch: the loss (1e-6)
    and every parameter's gradient, the head's and the layers' (1e-5), as unchunked. Other chunks take
    one of these paths (head_grad.balanced_chunks: 100 is 3 chunks of 84 as 37 is 7 of 36; a larger
    chunk is one chunk, as the micro-batch's own); the head with a bias runs 1 to 1000 below."""
    _close(reference, in_forward_batch(chunk))


def test_in_forward_scaled_after_the_loss():
    """A loss multiplied after the head's (grad_output 3.7, not 1): every gradient scaled as autograd's."""
    _close(in_forward_batch(None, scale=3.7), in_forward_batch(CHUNK, scale=3.7))


@pytest.mark.parametrize("lora,ac", [(True, False), (False, True)])
def test_in_forward_with_lora_layers_and_full_ac(lora, ac):
    """LoRA in the layers (the plain head frozen: no weight gradient computed, none returned) and
    torchtitan's full activation checkpointing of the blocks."""
    want = in_forward_batch(None, lora=lora, ac=ac)
    got = in_forward_batch(CHUNK, lora=lora, ac=ac)
    assert ("lm_head.weight" in got[1]) is not lora
    _close(want, got)


def _plain_head(bias: bool, tokens: int = 203, dim: int = 24, vocab: int = 97):
    g = torch.Generator().manual_seed(11)
    head = torch.nn.Linear(dim, vocab, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, dim, generator=g) * dim**-0.5)
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=g))
    hidden = torch.randn(2, tokens, dim, generator=g)
    labels = torch.randint(0, vocab, (2, tokens), generator=g)
    labels[:, ::5] = IGNORE_INDEX
    labels[1, :40] = IGNORE_INDEX  # a prompt
    return head, hidden, labels


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 64, 203, 406, 1000])
def test_in_forward_head_with_bias_equals_unchunked(bias, chunk):
    """A head with a bias, two rows of 203 tokens (chunks cross the rows), ignored labels, a divisor and
    a grad_output of 0.3: the loss and the gradients of the hidden states, weight and bias as unchunked."""
    divisor = torch.tensor(123.0)
    results = []
    for run in ("unchunked", "in_forward"):
        head, hidden, labels = _plain_head(bias)
        h = hidden.requires_grad_()
        if run == "unchunked":
            loss = CrossEntropyLoss(CrossEntropyLoss.Config())(head(h), labels, divisor)[0]
        else:
            loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=chunk))
            loss_fn.set_lm_head(head)
            loss_fn.set_head_backward("in_forward")
            loss = loss_fn(h, labels, divisor)[0]
        (loss * 0.3).backward()
        grads = {"hidden": h.grad, "weight": head.weight.grad, **({"bias": head.bias.grad} if bias else {})}
        results.append((loss.item(), grads))
    _close(*results)


def test_in_forward_inside_overlength_chunks():
    """overlength = "chunk": the trainer's loss inside a document chunk's checkpoint says so
    (``in_checkpoint=True``, passes.py), and the head's chunks run the recompute path there (the
    in-forward step never runs); without it they would compute their gradients in forward and again in
    the checkpoint's recompute, which is still right (the recompute's values replace the saved ones,
    backward runs once) but dearer: both equal the unchunked head."""
    tokens, labels, _ = _batch()
    results, steps = [], {}
    for run in ("unchunked", "in_checkpoint", "in_forward_inside"):
        model = _model()
        loss_fn, _ = _losses(None if run == "unchunked" else CHUNK)
        _wire(model, loss_fn)
        flag = {}
        if run != "unchunked":
            loss_fn.set_head_backward("in_forward")
            calls = steps.setdefault(run, [])
            loss_fn.chunk_step = lambda *a, _calls=calls, _step=loss_fn.chunk_step: (_calls.append(1), _step(*a))[1]
            flag = {"in_checkpoint": True} if run == "in_checkpoint" else {}
        out = chunked_loss(model, tokens[0], labels[0], 64, lambda p, lab: loss_fn(p, lab, **flag)[0])  # noqa: B023
        out.loss.backward()
        results.append((out.loss.item(), _grads(model)))
    _close(results[0], results[1])
    _close(results[0], results[2])
    assert steps["in_checkpoint"] == []
    # 4 document chunks of 64 tokens (252 tokens, the last 60), 2 head chunks each: the first 3 checkpointed
    # (forward and recompute), the last run once
    per_doc_chunk = -(-64 // CHUNK)
    assert len(steps["in_forward_inside"]) == 3 * 2 * per_doc_chunk + per_doc_chunk


def test_in_forward_forward_only_runs_plain_chunks():
    """Validation (no gradients): the chunks without the in-forward step, the same loss."""
    model = _model()
    loss_fn, _ = _losses(CHUNK)
    _wire(model, loss_fn)
    loss_fn.set_head_backward("in_forward")
    loss_fn.chunk_step = None  # would fail if called
    tokens, labels, positions = _batch()
    with torch.no_grad():
        pred = model(tokens, positions=positions, attention_masks=build_meta(list(DOCS), [0] * len(DOCS), 0, 1))
        got = loss_fn(pred, labels)[0].item()
    assert abs(got - micro_batch(None)[0] * GLOBAL_TOKENS) <= LOSS_TOL * abs(got)


def test_in_forward_second_backward_of_a_retained_graph_is_refused():
    """The kept gradients are scaled by grad_output in place: a retained graph's second backward fails on
    their version (autograd's own error) rather than handing back gradients scaled twice."""
    head, hidden, labels = _plain_head(bias=True)
    loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=64))
    loss_fn.set_lm_head(head)
    loss_fn.set_head_backward("in_forward")
    loss = loss_fn(hidden.requires_grad_(), labels)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_in_forward_under_autocast_as_single_device_training():
    """torchtitan's single-device mixed precision runs the step under ``torch.autocast`` (bf16) with float32
    parameters: the in-forward chunks run their matmuls in autocast's dtype (the weight cast once) and hand
    back float32 gradients. On CPU, against the float64 run of the same inputs, as close as autocast's
    unchunked head: the loss within u / 4, the hidden states' gradient within 2u, the weight's within the
    unchunked error + sqrt(chunks) u / 2 (u = 2^-8)."""
    tokens, dim, vocab, chunk = 512, 64, 1024, 100
    g = torch.Generator().manual_seed(2)
    weight, hidden = torch.randn(vocab, dim, generator=g) * dim**-0.5, torch.randn(1, tokens, dim, generator=g)
    labels = torch.randint(0, vocab, (1, tokens), generator=g)
    labels[0, ::7] = IGNORE_INDEX
    divisor = (labels != IGNORE_INDEX).sum().float()
    runs = {}
    for run in ("float64", "unchunked", "in_forward"):
        dtype = torch.float64 if run == "float64" else torch.float32
        head = torch.nn.Linear(dim, vocab, bias=False, dtype=dtype)
        with torch.no_grad():
            head.weight.copy_(weight)
        h = hidden.to(dtype, copy=True).requires_grad_()  # each run its own leaf
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run != "float64"):
            if run == "in_forward":
                loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=chunk))
                loss_fn.set_lm_head(head)
                loss_fn.set_head_backward("in_forward")
                loss = loss_fn(h, labels, divisor)[0]
            else:
                loss = CrossEntropyLoss(CrossEntropyLoss.Config())(head(h), labels, divisor)[0]
        loss.backward()
        assert h.grad.dtype == head.weight.grad.dtype == dtype
        runs[run] = loss.double().item(), {"hidden": h.grad.double(), "weight": head.weight.grad.double()}
    (ref_loss, ref), (un_loss, un), (got_loss, got) = runs["float64"], runs["unchunked"], runs["in_forward"]

    def err(grads: dict, name: str) -> float:
        return float((grads[name] - ref[name]).norm() / ref[name].norm())

    assert abs(got_loss - ref_loss) <= BF16_U / 4 * abs(ref_loss), (got_loss, un_loss, ref_loss)
    assert err(got, "hidden") <= 2 * BF16_U, (err(got, "hidden"), err(un, "hidden"))
    chunks = -(-tokens // chunk)
    assert err(got, "weight") <= err(un, "weight") + chunks**0.5 * BF16_U / 2, (err(got, "weight"), err(un, "weight"))


def test_head_backward_auto_forced_and_refused():
    """"auto": in forward for a plain Linear head with torchtitan's cross-entropy and no TP, else the
    recompute path, saying why; a forced "in_forward" where it cannot compose is refused in one message
    naming the key, the value and why; "recompute" is always honoured."""
    from skrull_ext.lora.converter import DropoutLoRALinear
    from skrull_ext.train.head_loss import in_forward_blocked, resolve_head_backward
    from torchtitan.components.loss import MSELoss

    ce = CrossEntropyLoss(CrossEntropyLoss.Config())
    plain = torch.nn.Linear(4, 8, bias=False)
    auto, forced = ChunkedHeadLoss.Config(), ChunkedHeadLoss.Config(head_backward="in_forward")
    got = resolve_head_backward(auto, plain, ce, tp=False)
    assert got.mode == "in_forward" and "loss.head_backward auto: a plain Linear head" in got.why
    assert got.line().startswith("head backward: in_forward (")
    assert "overlength" in resolve_head_backward(auto, plain, ce, tp=False, overlength_chunk=True).why
    assert resolve_head_backward(forced, plain, ce, tp=False).why.startswith("forced by loss.head_backward")
    recompute = resolve_head_backward(ChunkedHeadLoss.Config(head_backward="recompute"), plain, ce, tp=False)
    assert (recompute.mode, recompute.why) == ("recompute", "forced by loss.head_backward")

    lora = DropoutLoRALinear.__new__(DropoutLoRALinear)
    cases = {
        "tp": (plain, ce, True, "TP shards the head's weight"),
        "lora": (lora, ce, False, "the head is a DropoutLoRALinear, not a plain Linear"),
        "loss": (plain, MSELoss(MSELoss.Config()), False, "loss.loss_fn is MSELoss, not torchtitan's CrossEntropyLoss"),
    }
    for head, loss, tp, why in cases.values():
        assert why in in_forward_blocked(head, loss, tp)
        got = resolve_head_backward(auto, head, loss, tp)
        assert got.mode == "recompute" and got.why == f"loss.head_backward auto: {in_forward_blocked(head, loss, tp)}"
        with pytest.raises(JobFileError, match=r'loss.head_backward = "in_forward" cannot run here: ' + why):
            resolve_head_backward(forced, head, loss, tp)
    with pytest.raises(ValueError,
                       match=r"loss.head_backward: 'fused' must be one of 'auto', 'in_forward', 'recompute'"):
        ChunkedHeadLoss.Config(head_backward="fused")


def test_in_forward_chunk_from_the_memory_model():
    """In forward a chunk's peak is the logits and the float32 log-softmax: vocab x (elem + 4) B a token
    assumed; a profile measured with the other mode is said."""
    from skrull_ext.scheduler.profile_file import Profile

    assert assumed_head_bytes_per_token(151936, 2, "in_forward") == 151936 * 6
    config = ChunkedHeadLoss.Config(chunk_bytes=1 << 20)
    got = resolve_chunking(config, 2048, 4, head_backward="in_forward")
    assert got.chunk_tokens == (1 << 20) // (2048 * 8) and "vocabulary 2048 x (4 + 4) B" in got.why
    memory = {"logits_bytes_per_token": 4096.0, "head_chunk_tokens": 256}
    base = {"compute": {"a_us_per_flop": 1e-6, "b_us": 0.0}, "comm": {"bytes": [1], "us": [1.0]}}
    recompute = Profile({**base, "memory": memory}, "p.toml")
    assert "measured the head's chunks with head_backward recompute, the job runs in_forward" in \
        resolve_chunking(config, 2048, 4, recompute, head_backward="in_forward").why
    assert "measured the head's" not in resolve_chunking(config, 2048, 4, recompute).why
    in_forward = Profile({**base, "memory": {**memory, "head_grad_bytes": 2048.0 * 64 * 4}}, "p.toml")
    assert "measured the head's" not in resolve_chunking(config, 2048, 4, in_forward, head_backward="in_forward").why
    table = {"bucket_size": 1, "a_bytes_per_token": 1.0, "b_bytes": 0.0, "usable_bytes": 1.0, "static_bytes": 0.0}
    assert ProfileMemory.of({"memory": {**table, "head_grad_bytes": 8.0}}).section()["head_grad_bytes"] == 8.0
    assert "head_grad_bytes" not in ProfileMemory.of({"memory": table}).section()  # absent: recompute, as before


def test_job_file_sets_head_backward(tmp_path):
    from skrull_ext.train.job.job_file import load_job

    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n[loss]\nhead_backward = "recompute"\n')
    assert load_job(str(job)).loss.head_backward == "recompute"
    job.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n')
    assert load_job(str(job)).loss.head_backward == "auto"


# The GPU check (stage 3' of tools/gpu_checks.sh runs it): Qwen2.5-0.5B's head (896 -> 151,936) in bf16
# on 8,192 tokens, in chunks of 880 (loss.chunk_bytes' 2 GiB at 16 B a token and vocabulary entry:
# head_loss.py), 10 chunks, the last 272 tokens.
QWEN_DIM, QWEN_VOCAB, CUDA_TOKENS, CUDA_CHUNK = 896, 151_936, 8192, 880
BF16_U = 2.0**-8
"""bf16's unit roundoff (8 significant bits, round to nearest): one rounding's relative error at most."""


def head_loss_run(device: str, tokens: int, dim: int, vocab: int, chunk: int | None,
                  dtype: torch.dtype = torch.bfloat16, mode: str = "recompute") -> tuple[float, dict]:
    """Loss and gradients (hidden states, head weight) of a head and the loss, the inputs rounded to
    bf16 first, so that a float64 run of the same inputs is their reference; the chunks in ``mode``
    (loss.head_backward). ``chunk`` None:
    unchunked (torchtitan's CrossEntropyLoss on the logits; float64: the plain cross-entropy,
    which torchtitan's would compute in float32)."""
    g = torch.Generator().manual_seed(5)
    weight = (torch.randn(vocab, dim, generator=g) * dim**-0.5).bfloat16()
    hidden = torch.randn(1, tokens, dim, generator=g).bfloat16()
    labels = torch.randint(0, vocab, (1, tokens), generator=g)
    labels[0, ::9] = IGNORE_INDEX
    head = torch.nn.Linear(dim, vocab, bias=False, device=device, dtype=dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
    h = hidden.to(device, dtype).requires_grad_()
    labels = labels.to(device)
    divisor = (labels != IGNORE_INDEX).sum().to(torch.float32)
    if dtype == torch.float64:
        loss = torch.nn.functional.cross_entropy(head(h).flatten(0, 1), labels.flatten(0, 1), reduction="sum",
                                                 ignore_index=IGNORE_INDEX) / divisor
    else:
        loss_fn, _ = _losses(chunk)
        if chunk is not None:
            loss_fn.set_lm_head(head)
            loss_fn.set_head_backward(mode)
        loss, _ = loss_fn(h * 1.0 if chunk is not None else head(h), labels, divisor)
    loss.backward()
    return loss.double().item(), {"hidden": h.grad.double(), "weight": head.weight.grad.double()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the bf16 head and loss as a GPU runs them)")
@pytest.mark.parametrize("mode", ["recompute", "in_forward"])
def test_bf16_head_loss_on_cuda_equals_unchunked(mode):
    """Chunked against unchunked in bf16 on CUDA, both against the float64 run of the same bf16 inputs,
    the chunks in either ``loss.head_backward`` mode. Tolerances, in bf16's unit roundoff u = 2^-8:

    - the loss: both sum float32 cross-entropies of bf16 logits that differ at most by one rounding
      where cuBLAS picks another kernel for a chunk's shape; each token's loss moves by under u, and
      over the 7,281 loss tokens the mean moves by far less: u / 4 relative;
    - the hidden states' gradient: each chunk's rows are computed as unchunked (a row's logits, their
      gradient scaled in float32 and rounded to bf16, one GEMM into bf16; in_forward the same, in
      train/head_grad.py), so within 2u of the reference, as unchunked;
    - the head's weight gradient: unchunked it is one GEMM over every token, rounded once; recompute,
      autograd adds the 10 chunks' bf16 partial gradients in the parameter's dtype (as FSDP's
      unsharded bf16 parameter does in a run), 9 more roundings of at most u / 2 each, which add up
      like a random walk over millions of elements: within the unchunked error + sqrt(10) u / 2
      (on CPU at 1,024 tokens in 12 chunks: 3.0e-3 chunked, 1.7e-3 unchunked); in_forward, the chunks'
      products accumulate in float32 (cuBLAS's addmm with out_dtype) and are rounded once in backward:
      the same bar holds with room (on CPU at 1,024 tokens in chunks of 100, each product rounded to
      bf16 first: 0.61u against 1.09u recomputed and 0.43u unchunked).
    """
    shape = ("cuda", CUDA_TOKENS, QWEN_DIM, QWEN_VOCAB)
    ref_loss, ref = head_loss_run(*shape, None, torch.float64)
    un_loss, un = head_loss_run(*shape, None)
    ch_loss, ch = head_loss_run(*shape, CUDA_CHUNK, mode=mode)

    def err(got: dict, name: str) -> float:
        return float((got[name] - ref[name]).norm() / ref[name].norm())

    assert abs(ch_loss - un_loss) <= BF16_U / 4 * abs(un_loss), (ch_loss, un_loss)
    assert abs(ch_loss - ref_loss) <= BF16_U / 4 * abs(ref_loss), (ch_loss, ref_loss)
    assert err(un, "hidden") <= 2 * BF16_U and err(ch, "hidden") <= 2 * BF16_U, (err(un, "hidden"), err(ch, "hidden"))
    chunks = -(-CUDA_TOKENS // CUDA_CHUNK)
    assert err(ch, "weight") <= err(un, "weight") + chunks**0.5 * BF16_U / 2, (err(ch, "weight"), err(un, "weight"))


def test_in_forward_chunks_are_balanced_so_the_compiled_step_compiles_twice_at_most():
    """The in-forward chunks of a micro-batch split its tokens as evenly as ``chunk`` allows (sizes
    differ by one at most, none over ``chunk``), so a compiled chunk step never meets a 1-token last
    chunk: torch.compile specialises size 1 and compiled again for it whenever a micro-batch's
    length was one past a multiple of the chunk (GPU run 9: a recompile after warm-up, "expected
    2502, actual 1"). The step compiles once static, once dynamic at the second size, then never."""
    from skrull_ext.train.head_grad import head_loss_in_forward, linear_cross_entropy_grad

    graphs, sizes = [], []

    def counting(gm, example_inputs):  # a backend that counts the graphs dynamo hands it
        graphs.append(len(sizes))
        return gm.forward

    torch._dynamo.reset()
    step = torch.compile(linear_cross_entropy_grad, backend=counting)

    def watched(h, w, b, lab, scale):
        sizes.append(h.shape[0])
        return step(h, w, b, lab, scale)

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, 16, generator=g, requires_grad=True)
    for n in (17, 33, 25, 9, 40, 41, 57):  # 17 = 2 x 8 + 1: a 1-token last chunk, unbalanced
        h = torch.randn(n, 16, generator=g, requires_grad=True)
        labels = torch.randint(0, VOCAB, (n,), generator=g)
        head_loss_in_forward(h, weight, None, labels, None, 8, watched).backward()
    torch._dynamo.reset()
    assert max(sizes) <= 8 and min(sizes) >= 2, sizes
    assert sizes[:3] == [6, 6, 5]  # 17 tokens in ceil(17 / 8) = 3 chunks
    assert len(graphs) <= 2 and graphs[-1] <= 3, (graphs, sizes)  # both compiles in the first micro-batch
