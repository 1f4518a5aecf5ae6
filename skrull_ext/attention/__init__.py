# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP attention: local sequences attended whole while the distributed
sequences' K/V all-gather is in flight. See dacp.py for the execution order
and docs/design/buffer_layout.md for the buffer it consumes."""

from skrull_ext.attention.dacp import dacp_attention
from skrull_ext.attention.exchange import KVExchange, start_exchange, wait_exchange
from skrull_ext.attention.kernels import KERNEL_CHOICES, KERNELS
from skrull_ext.attention.meta import (
    build_meta,
    DacpBatchMeta,
    DISTRIBUTED,
    document_causal_mask,
    padded_length,
    shard_buffer,
    unshard_buffer,
    zigzag_positions,
    zigzag_shard,
    zigzag_unshard,
)
from skrull_ext.attention.module import DacpAttention
from skrull_ext.attention.rank_sets import build_set_meta, shard_set_buffer, unshard_set_buffer
from skrull_ext.attention.replay import in_backward, KVReplay
from skrull_ext.attention.segments import build_segment_plan, SegmentPlan
from skrull_ext.attention.stats import DacpStats
from skrull_ext.attention.stream import side_stream_for, SideStream
from skrull_ext.attention.transport import resolve_transport, Transport, TRANSPORTS

__all__ = [
    "DISTRIBUTED",
    "DacpAttention",
    "DacpBatchMeta",
    "DacpStats",
    "KERNELS",
    "KERNEL_CHOICES",
    "KVExchange",
    "KVReplay",
    "SegmentPlan",
    "SideStream",
    "TRANSPORTS",
    "Transport",
    "build_meta",
    "build_set_meta",
    "build_segment_plan",
    "dacp_attention",
    "in_backward",
    "document_causal_mask",
    "padded_length",
    "resolve_transport",
    "shard_buffer",
    "shard_set_buffer",
    "side_stream_for",
    "start_exchange",
    "unshard_buffer",
    "unshard_set_buffer",
    "wait_exchange",
    "zigzag_positions",
    "zigzag_shard",
    "zigzag_unshard",
]
