"""REFERENCE ONLY: cost_model.hpp restated in plain Python (reference.py's cost model).

The product never calls it. Same operations in the same order as the core, so the references'
prices equal the core's bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

RECOMPUTE_SHARE = 1.0 / 3.0  # cost_model.hpp kRecomputeShare


@dataclass
class RefCost:
    layers: int
    hidden: int
    kv_width: int
    bytes_per_elem: int
    a: float
    b: float
    xs: list[float]
    ys: list[float]
    threshold: float = 0.0
    floor: float = 0.0
    per_layer: float = 2.0
    fixed: float = 0.0  # micro_batch_fixed_us: once per micro-batch, not per layer
    tp: int = 1  # ModelShape.tp: FLOPs and K/V bytes are one TP rank's share
    token: float = 0.0  # token_us: per token of the rank holding the most, outside the layers
    margin: float = 1.0  # comm.plan_margin: placements chosen at margin x the exchange, priced at 1x (hedge.hpp)
    attention: float = 1.0  # attention_weight: the attention term's weight in flops()
    whole: bool = False  # whole_buffer: each part of a rank's buffer priced as one sequence of its length
    step: float = 0.0  # step_fixed_us: once a step that runs anything (timing: reference_chunked.py)
    host_floor: float = 0.0  # host_floor_us: a rank's layer call costs at least this, once per call
    regather: bool = False  # chunk_regather: a checkpointed chunk's recompute all-gathers its K/V again

    @classmethod
    def of(cls, cm) -> RefCost:
        s, c = cm.shape, cm.comm
        return cls(s.layers, s.hidden, s.kv_width, s.bytes_per_elem, cm.a_us_per_flop, cm.b_us,
                   list(c.bytes), list(c.us), c.threshold_bytes, c.floor_us, c.collectives_per_layer,
                   cm.micro_batch_fixed_us, s.tp, cm.token_us, c.plan_margin, cm.attention_weight, cm.whole_buffer,
                   cm.step_fixed_us, cm.host_floor_us, cm.chunk_regather)

    def planning(self) -> RefCost:
        """hedge.hpp planning_model: every exchange at margin x its price."""
        return replace(self, per_layer=self.per_layer * self.margin, margin=1.0)

    def flops(self, s: int) -> float:
        h, hkv, x = float(self.hidden), float(self.kv_width), float(s)
        return (20.0 * h * h * x + 4.0 * h * hkv * x + self.attention * 4.0 * h * x * x) / self.tp

    def local_flops(self, tokens: int, per_doc: float) -> float:  # and dist_flops: cost_model.hpp's
        return self.flops(tokens) if self.whole else per_doc

    def dist_flops(self, tokens: int, share: float, n: int) -> float:
        return self.flops(tokens) / n if self.whole else share

    def kv_bytes(self, s: int) -> float:
        return 2.0 * float(s) * float(self.kv_width) * self.bytes_per_elem / self.tp

    def line(self, f: float) -> float:
        return self.a * f + self.b if f > 0.0 else 0.0

    def layer(self, comm: float, local: float, dist: float) -> float:
        """cost_model.hpp layer_us: max(floor, max(comm, line(local)) + line(dist)), the floor once a call."""
        device = max(comm, self.line(local)) + self.line(dist)
        return max(self.host_floor, device) if local > 0.0 or dist > 0.0 else device

    def comp(self, f: float) -> float:
        return self.layer(0.0, f, 0.0)

    def floored(self, calls: float) -> float:
        """cost_model.hpp floored_us: what `calls` micro-batches cost at least."""
        return calls * (self.layers * self.host_floor + self.fixed)

    def pad(self) -> float:
        """cost_model.hpp pad_pass_us: a lockstep pad pass, one local token a CP rank through every layer."""
        return self.layers * self.comp(self.flops(1)) + self.fixed + self.token * 1

    def chunk_pass(self, prefix: int, tokens: int, cp: int, recomputed: bool) -> float:
        """cost_model.hpp chunk_pass_us (dense = false): one chunk pass of a chunked document."""
        f = self.flops(prefix + tokens) - self.flops(prefix)
        f /= cp
        v = self.kv_bytes(tokens)
        again = self.collective(v) if recomputed and self.regather else 0.0
        exchange = self.per_layer * self.collective(v) + again if cp > 1 else 0.0
        share = 1.0 + RECOMPUTE_SHARE if recomputed else 1.0
        return self.layers * max(self.host_floor * share, self.line(f) * share + exchange) + \
            (self.token * float(tokens) / cp * share + self.fixed)

    def pad_chunks(self, start: int, count: int, cp: int) -> float:
        """cost_model.hpp pad_chunks_us: `count` lockstep pad chunks from `start` tokens, the last not
        recomputed; the recomputed ones at the floor up to some k, on the line after (closed form)."""
        if count <= 0:
            return 0.0
        m = count - 1
        last = self.chunk_pass(start + m * cp, cp, cp, False)
        if m == 0:
            return last
        s = 1.0 + RECOMPUTE_SHARE
        v = self.kv_bytes(cp)
        x = self.per_layer * self.collective(v) + (self.collective(v) if self.regather else 0.0) if cp > 1 else 0.0
        f0 = (self.flops(start + cp) - self.flops(start)) / cp
        d = (self.flops(2) - 2.0 * self.flops(1)) * cp

        def on_line(j: int) -> bool:
            return (self.a * (f0 + float(j) * d) + self.b) * s + x >= self.host_floor * s

        k = 0
        if not on_line(0):
            k = m
            slope = self.a * d * s
            if slope > 0.0:
                j = math.ceil((self.host_floor * s - (self.a * f0 + self.b) * s - x) / slope)
                k = max(0, int(j)) if j < m else m
                while k > 0 and on_line(k - 1):
                    k -= 1
                while k < m and not on_line(k):
                    k += 1
        n = float(m - k)
        js = (float(k) + float(m - 1)) * n / 2.0
        layers = float(self.layers)
        return last + float(k) * layers * self.host_floor * s + \
            layers * (n * ((self.a * f0 + self.b) * s + x) + self.a * d * s * js) + \
            float(m) * (self.token * float(cp) / cp * s + self.fixed)

    def collective(self, v: float) -> float:
        if v <= 0.0:
            return 0.0
        if v < self.threshold:
            return self.floor
        xs, ys = self.xs, self.ys
        if len(xs) == 1 or v <= xs[0]:
            return ys[0]
        hi = min(next((i for i, x in enumerate(xs) if x > v), len(xs)), len(xs) - 1)
        return max(0.0, ys[hi - 1] + (ys[hi] - ys[hi - 1]) * (v - xs[hi - 1]) / (xs[hi] - xs[hi - 1]))

    def micro_batch(self, local: list[float], dist: float, vol: float, most: int = 0) -> float:
        comm = self.per_layer * self.collective(vol)
        worst = max([0.0] + [self.layer(comm, f, dist) for f in local])  # the first of equals kept
        return self.layers * worst + self.fixed + self.token * most
