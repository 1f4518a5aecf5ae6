"""Host synchronisations of a training step, found on CPU: what would stall a GPU.

On a GPU the host queues kernels ahead of the device; an op whose result the
host must read (a tensor's value becoming a Python number, a data-dependent
output shape, a copy to host memory, an explicit synchronize) waits until the
device has run everything queued before it, and the device then idles while
the host prepares the next kernels. None of this shows on CPU, where every op
runs when called. ``HostSyncs`` records, around any code run on CPU, every
call that would be such a wait on CUDA, with the Python call site that made
it, so a test can pin the exact set a training step makes
(tests/unit_tests/test_no_host_sync.py) and ``tools/host_syncs.py`` can list them.

What is recorded (``Sync.op``):

- aten ops seen by a ``TorchDispatchMode`` whose output needs the device's
  data on the host (``SYNC_OPS``): ``_local_scalar_dense`` (``.item()``,
  ``float(t)``, ``int(t)``, ``bool(t)``), ``is_nonzero``, ``equal``,
  ``nonzero``, ``masked_select``, ``unique*``, boolean indexing, and
  ``repeat_interleave`` of a repeats tensor without ``output_size``;
- Python calls that read or wait where the dispatcher does not see them
  (``PATCHED``): ``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.cpu``,
  ``Tensor.to("cpu")`` of a device tensor (the host named by the string), and
  ``Tensor.to(device)`` of a host tensor to a ``torch.device`` (the job's device:
  on CPU the host) without ``non_blocking`` (on CUDA, copy_ synchronises the
  stream after it);
  ``torch.tensor``/``torch.as_tensor`` with a ``device`` (a blocking copy from
  pageable host memory), and ``torch.cuda.synchronize``,
  ``Event.synchronize``, ``Stream.synchronize``.

On CPU a tensor's device does not say whether the job keeps it on the host
(a plan's tensors, built by the dataloader) or on the device (everything a
model's op produced): ``Sync.device`` is True where the tensor read was made
by an aten op inside the recorded region (its output, or an output of an op
fed by one) or is a parameter, a gradient or an optimizer state given to
``HostSyncs(device_tensors=...)``; a read of a host-built tensor is recorded
with ``device`` False and is no wait on a GPU. Only the calling thread is
recorded (dispatch modes are thread-local: the dataloader's prefetch thread
is not).
"""

from __future__ import annotations

import os
import threading
import traceback
import weakref
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["HostSyncs", "Sync", "SYNC_OPS", "call_site"]

_ops = torch.ops.aten
SYNC_OPS = {
    _ops._local_scalar_dense.default: "item",
    _ops.is_nonzero.default: "bool",
    _ops.equal.default: "equal",
    _ops.nonzero.default: "nonzero",
    _ops.masked_select.default: "masked_select",
    _ops._unique.default: "unique",
    _ops._unique2.default: "unique",
    _ops.unique_dim.default: "unique",
    _ops.unique_consecutive.default: "unique",
}
"""aten ops that read the device's data to the host on CUDA, whatever their arguments."""

FACTORIES = ("zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint", "linspace", "eye")
"""torch's factories: what they make with an explicit ``device`` is taken as the device's."""

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HERE = os.path.abspath(__file__)


@dataclass(frozen=True)
class Sync:
    """One call that waits for the device on CUDA."""

    op: str
    """What waits: ``item``, ``nonzero``, ``tolist``, ``to(cpu)``, ``cuda.synchronize``..."""
    site: str
    """The innermost frame of the project (``skrull_ext/...py:function``), or outside torch."""
    via: str
    """The innermost frame outside torch when it is not ``site`` (e.g. torchtitan's), else ''."""
    device: bool
    """The value read is the device's (False: a host-built tensor, no wait on a GPU)."""
    line: int = 0
    """``site``'s line (not compared: ``counted`` groups by op and function)."""
    stack: tuple[str, ...] = ()
    """The frames outside torch, innermost last (``HostSyncs(stacks=True)``)."""

    def said(self) -> str:
        site = f"{self.site.rsplit(':', 1)[0]}:{self.line} {self.site.rsplit(':', 1)[1]}" if self.line else self.site
        where = f"{site} (via {self.via})" if self.via else site
        return f"{self.op} at {where}" + ("" if self.device else " [host tensor: no wait]")


def call_site(skip: int = 0) -> tuple[str, str, int, tuple[str, ...]]:
    """(site, via, site's line, frames) of the caller's stack: the innermost frame in this
    project, the innermost outside torch and this module when that is another (torchtitan's,
    say), and every frame outside torch, innermost last."""
    site = via = ""
    line = 0
    frames = []
    for frame in traceback.extract_stack()[:-1 - skip]:
        path = os.path.abspath(frame.filename)
        if path != _HERE and not path.startswith(_TORCH):
            frames.append((path, frame))
    for path, frame in reversed(frames):
        name = f"{_short(path)}:{frame.name}"
        if not via:
            via = name
        if path.startswith(_ROOT) and "site-packages" not in path:
            site, line = name, frame.lineno
            break
    if not site:
        site, via, line = via, "", frames[-1][1].lineno if frames else 0
    said = tuple(f"{_short(p)}:{f.lineno} {f.name}" for p, f in frames)
    return site, ("" if via == site else via), line, said


def _short(path: str) -> str:
    if path.startswith(_ROOT) and "site-packages" not in path:
        return os.path.relpath(path, _ROOT)
    marker = "site-packages" + os.sep
    return path.split(marker, 1)[1] if marker in path else path


class _Mode(TorchDispatchMode):
    def __init__(self, owner: HostSyncs):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.owner
        op = SYNC_OPS.get(func)
        if op is None and func is _ops.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            op = "repeat_interleave"
        if op is None and func in (_ops.index.Tensor, _ops.index_put.default, _ops.index_put_.default):
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None):
                op = "bool index"
        if op is not None:
            owner._add(op, args, kwargs)
        out = func(*args, **kwargs)
        owner._made(args, kwargs, out)
        return out


class HostSyncs:
    """Records the calls that would wait for a GPU (module docstring) made while entered.

    ``device_tensors``: tensors that live on the device in a GPU job (the model's parameters,
    their gradients, optimizer states), beside those the region's own aten ops produce."""

    def __init__(self, device_tensors: Iterable[torch.Tensor] = (), stacks: bool = False):
        self.syncs: list[Sync] = []
        self.stacks = stacks
        self._device: dict[int, weakref.ref] = {}
        """id -> the device tensor (weakly; a Tensor compares by value, so no WeakSet)."""
        for t in device_tensors:
            self._mark(t)
        self._thread = threading.get_ident()
        self._stack: ExitStack | None = None
        self._busy = False

    # ---------------------------------------------------------------- tensors
    def _mark(self, t: torch.Tensor) -> None:
        key, table = id(t), self._device
        table[key] = weakref.ref(t, lambda _, key=key: table.pop(key, None))
        local = getattr(t, "_local_tensor", None)  # a DTensor (FSDP, TP): its ops reach the mode as its shard's
        if isinstance(local, torch.Tensor):
            self._mark(local)

    def _has(self, t: torch.Tensor) -> bool:
        ref = self._device.get(id(t))
        return ref is not None and ref() is t

    def _is_device(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if self._has(t) or (t._base is not None and self._has(t._base)):
            return True
        local = getattr(t, "_local_tensor", None)  # a DTensor made outside the mode, of a device shard
        return isinstance(local, torch.Tensor) and self._is_device(local)

    def _made(self, args, kwargs, out) -> None:
        """An aten op ran inside the region: its outputs are the device's where an input is (a
        GPU op's outputs are on its inputs' device; factories: ``_patches``)."""
        if any(self._is_device(t) for t in tree_flatten((args, kwargs))[0]):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._mark(t)

    # ---------------------------------------------------------------- records
    def _add(self, op: str, args=(), kwargs=None, device: bool | None = None) -> None:
        if threading.get_ident() != self._thread or self._busy:
            return
        self._busy = True
        try:
            if device is None:
                device = any(self._is_device(t) for t in tree_flatten((args, kwargs or {}))[0])
            site, via, line, frames = call_site()
            self.syncs.append(Sync(op, site, via, device, line, frames if self.stacks else ()))
        finally:
            self._busy = False

    def waits(self) -> list[Sync]:
        """The calls that would wait for the device (reads of host-built tensors left out)."""
        return [s for s in self.syncs if s.device]

    def counted(self, waits_only: bool = True) -> Counter:
        """Each (op, site, via) with how many times it ran."""
        return Counter((s.op, s.site, s.via) for s in (self.waits() if waits_only else self.syncs))

    def lines(self, waits_only: bool = False) -> list[str]:
        out = []
        for (op, site, via), n in sorted(self.counted(waits_only).items(), key=lambda kv: kv[0][1]):
            first = next(s for s in self.syncs if (s.op, s.site, s.via) == (op, site, via))
            out.append(f"{n:4d} x {first.said()}")
        return out

    # ---------------------------------------------------------------- patches
    def _patch(self, stack: ExitStack, owner, name: str, wrap) -> None:
        original = getattr(owner, name)
        setattr(owner, name, wrap(original))
        stack.callback(setattr, owner, name, original)

    def _patches(self, stack: ExitStack) -> None:
        rec = self

        def reading(op: str):
            def wrap(original):
                def method(t, *a, **k):
                    rec._add(op, (t,))
                    return original(t, *a, **k)
                return method
            return wrap

        for name in ("tolist", "numpy", "cpu"):
            self._patch(stack, torch.Tensor, name, reading(name))

        def to_wrap(original):
            def to(t, *a, **k):
                dev = _to_device(a, k)
                if dev is None:
                    return original(t, *a, **k)
                to_host = (a[:1] or (k.get("device"),))[0] == "cpu"  # the host named: .to("cpu")
                if rec._is_device(t):
                    # The device's data to the host where the host is named; else to the device it is on
                    # (on CPU a device tensor's own device is the host too: ``x.to(y.device)``).
                    if to_host:
                        rec._add("to(cpu)", (t,))
                    return original(t, *a, **k)
                if to_host:  # host to host
                    return original(t, *a, **k)
                # A host tensor to the job's device (a torch.device: on CPU the host): on CUDA a copy
                # without non_blocking synchronises the stream after it (copy_'s cudaStreamSynchronize).
                if not (k.get("non_blocking") or any(x is True for x in a[1:])):
                    rec._add("to(device) blocking", (t,), device=True)
                out = original(t, *a, **{**k, "copy": True})  # on CPU ``to`` would return t itself
                rec._mark(out)
                return out
            return to

        self._patch(stack, torch.Tensor, "to", to_wrap)

        def factory(name: str, copies: bool):
            def wrap(original):
                def make(*a, **k):
                    if k.get("device") is None:
                        return original(*a, **k)
                    if copies:  # host data to the device, synchronously
                        rec._add(f"torch.{name}(device=)", device=True)
                    out = original(*a, **k)
                    rec._mark(out)  # made with an explicit device: the job's (host code names none)
                    return out
                return make
            return wrap

        for name in ("tensor", "as_tensor"):
            self._patch(stack, torch, name, factory(name, True))
        for name in FACTORIES:
            self._patch(stack, torch, name, factory(name, False))

        def waiting(op: str):
            def wrap(original):
                def call(*a, **k):
                    rec._add(op, device=True)
                    return original(*a, **k)
                return call
            return wrap

        self._patch(stack, torch.cuda, "synchronize", waiting("cuda.synchronize"))
        self._patch(stack, torch.cuda.Event, "synchronize", waiting("Event.synchronize"))
        self._patch(stack, torch.cuda.Stream, "synchronize", waiting("Stream.synchronize"))

    def __enter__(self) -> HostSyncs:
        self._thread = threading.get_ident()
        stack = ExitStack()
        self._patches(stack)
        stack.enter_context(_Mode(self))
        self._stack = stack
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


def _to_device(args, kwargs) -> torch.device | None:
    """The device a ``Tensor.to`` call names (None: a dtype-only or tensor-like call)."""
    dev = kwargs.get("device")
    if dev is None and args and isinstance(args[0], (str, torch.device)):
        dev = args[0]
    if dev is None:
        return None
    return torch.device(dev)
