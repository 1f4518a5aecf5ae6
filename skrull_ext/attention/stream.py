# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""A side stream for the local part of DACP attention, so one code path serves
CUDA and CPU.

On CUDA the local sequences' attention runs on a side stream while the
distributed part's K/V all-gather is in flight on the collective's stream and
the main stream waits for it. Ordering is by stream waits (events under the
hood), and every tensor that crosses streams is ``record_stream``-ed on the
stream that uses it, so the caching allocator does not hand its memory to
another kernel while the using stream may still read it.

On CPU there are no streams: every method is a no-op and the region runs
inline. The overlap then comes from gloo, which runs an ``async_op=True``
collective on its own worker thread while this thread computes.

Autograd needs nothing extra: backward nodes run on the stream their forward
ran on, and the engine inserts the cross-stream waits itself.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["SideStream", "side_stream_for"]


class SideStream:
    """Fork/join of one side stream; a no-op on devices without streams."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self._mod = None
        self.stream = None
        if self.device.type != "cpu":
            mod = torch.get_device_module(self.device.type)
            if hasattr(mod, "Stream") and hasattr(mod, "current_stream"):
                self._mod = mod
                self.stream = mod.Stream(device=self.device)

    @property
    def enabled(self) -> bool:
        return self.stream is not None

    @contextmanager
    def fork(self, *inputs: torch.Tensor) -> Iterator[None]:
        """Run the body on the side stream, after all work queued so far on the
        current stream; ``inputs`` (made on the current stream) are marked as
        used by the side stream."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(self._mod.current_stream(self.device))
        for t in inputs:
            t.record_stream(self.stream)
        with self._mod.stream(self.stream):
            yield

    def join(self, *outputs: torch.Tensor) -> None:
        """Make the current stream wait for the side stream; ``outputs`` (made on
        the side stream) are marked as used by the current stream."""
        if self.stream is None:
            return
        current = self._mod.current_stream(self.device)
        current.wait_stream(self.stream)
        for t in outputs:
            t.record_stream(current)


_SIDE_STREAMS: dict[torch.device, SideStream] = {}


def side_stream_for(device: torch.device) -> SideStream:
    """The process-wide side stream of ``device`` (streams are costly to create
    per call and one is enough: the local parts of successive layers are
    ordered anyway)."""
    device = torch.device(device)
    if device.type != "cpu" and device.index is None:
        device = torch.device(device.type, torch.get_device_module(device.type).current_device())
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = SideStream(device)
    return _SIDE_STREAMS[device]
