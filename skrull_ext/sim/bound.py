"""A lower bound on the iteration time of any plan, so every policy can be
reported as a gap to it.

Built only from the core's cost-model functions. Two terms, the larger wins:

- work: every micro-batch takes at least ``layers * (a * F / N + b) + f``
  (its FLOPs F spread perfectly over the N CP ranks, one call's overhead,
  the micro-batch's fixed cost f = ``micro_batch_fixed_us``). A
  micro-batch holds at most ``N * BucketSize`` tokens, so the global batch
  needs M >= ceil(tokens / (N * C)) of them. The slowest DP rank takes at
  least the average over DP ranks, ``a * F_total / (DP * N) + (b + f / layers) * M / DP``
  (times layers), and at least ``a * F_total / (DP * N) + b`` (+ f: a rank
  with work has one micro-batch; with r <= DP ranks working, one has
  F_total / r);
- longest sequence: its own micro-batch takes at least what the sequence
  alone takes, whole on one rank (only if it fits there) or sharded and
  paying its K/V exchange (needs a non-decreasing comm table, as the core's
  ``micro_batch_lower_bound_us``).

The larger of the two is the **classic bound** (``classic_bound_us``): it
holds on every timeline. On a lockstep timeline (config.TIMELINES) a third
term, the **lockstep-aware bound** (``lockstep_bound_us``): the longest
sequence's slot, then the slots the tokens that slot cannot hold need
(at least the issue-36 definition: the longest sequence's slot time plus
the linear cost, spread over the world, of the tokens one slot of C per
rank cannot hold; this one also counts those tokens' attention, pro rata,
and each further slot's call overhead). Every lockstep step is at least as
long as the same plan free-running, so the classic terms hold there too.
``lower_bound_us`` is the largest that holds on the timeline; ``bench
simulate`` prints the gap to both (docs/benchmarks.md, section 4).

Every term adds the cost model's ``step_fixed_us``: a step pays it once,
whatever its plan (0 on the assumed H100 and under lockstep execution).
The head's time (``token_us`` a token, outside the layers) counts for the
tokens each term's ranks hold at least: the average over the ranks, or the
longest sequence's shard.

No plan can beat it under the cost model; it is not always reachable.

``pool_lower_bound_us`` is the bound for plans that may shard a sequence
over any set of ranks of the world (policy ``skrull-pool``: blocks of CP
groups, or 2..cp-1 ranks of one group, whose exchange is cheaper than the
group's): the work term, and the longest sequence's compute spread over all
DP x CP ranks with no exchange. Weaker, but it holds for every pool plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from skrull_ext import _core
from skrull_ext._core import CostModel


def work_bound_us(lengths: Sequence[int], cost: CostModel, dp: int, cp: int, bucket_size: int) -> float:
    if not lengths:
        return 0.0
    total_flops = sum(cost.flops(s) for s in lengths)
    min_micro_batches = math.ceil(sum(lengths) / (bucket_size * cp))
    calls = max(1.0, min_micro_batches / dp)
    # The calls a rank makes cost at least the host floor each (cost_model.hpp floored_us).
    layers_us = max(cost.shape.layers * (cost.a_us_per_flop * total_flops / (dp * cp) + cost.b_us * calls)
                    + cost.micro_batch_fixed_us * calls, cost.floored_us(calls))
    return layers_us + cost.token_us * sum(lengths) / (dp * cp) + cost.step_fixed_us


def longest_bound_us(lengths: Sequence[int], cost: CostModel, cp: int, bucket_size: int) -> float:
    if not lengths:
        return 0.0
    s = max(lengths)
    bound = cost.micro_batch_lower_bound_us([s], cp)
    if s > bucket_size and cp > 1 and cost.comm_is_monotone():
        # Too long to stay whole on one rank: it must be sharded and pay its exchange.
        f = cost.flops(s)
        shard = _core.shard_tokens(s, cp)
        sharded = cost.layer_us(cost.comm_us(cost.kv_bytes(shard * cp)), 0.0, f / cp)
        bound = max(bound, cost.shape.layers * sharded + cost.micro_batch_fixed_us + cost.token_us * shard)
    return bound + cost.step_fixed_us


def classic_bound_us(lengths: Sequence[int], cost: CostModel, dp: int, cp: int, bucket_size: int) -> float:
    """The classic bound: all work spread over the world, or the longest sequence alone (either timeline)."""
    return max(work_bound_us(lengths, cost, dp, cp, bucket_size), longest_bound_us(lengths, cost, cp, bucket_size))


def lockstep_bound_us(lengths: Sequence[int], cost: CostModel, dp: int, cp: int, bucket_size: int) -> float:
    """On a lockstep timeline: the longest sequence's slot, then the slots the rest needs.

    The slot holding the longest sequence lasts at least as long as that
    sequence alone (``longest_bound_us``) and holds at most dp micro-batches
    of cp x BucketSize tokens. The R tokens beyond that run in other slots,
    at least ceil(R / (dp cp C)) of them, each at least
    ``layers * (a * F_slot / (dp cp) + b) + f`` (its largest micro-batch is
    at least the mean). Their FLOPs are at least those of the shortest
    sequences holding R tokens, the last one counted pro rata (FLOPs per
    token grow with length, so this fractional choice is the least)."""
    if not lengths:
        return 0.0
    rest = sorted(lengths)
    rest.pop()  # the longest runs in its own slot
    outside = sum(lengths) - dp * cp * bucket_size
    head = longest_bound_us(lengths, cost, cp, bucket_size)
    if outside <= 0:
        return head
    need, flops = outside, 0.0
    for s in rest:
        take = min(s, need)
        flops += cost.flops(s) * take / s
        need -= take
        if need <= 0:
            break
    slots = math.ceil(outside / (dp * cp * bucket_size))
    # Each slot's calls cost at least the host floor (cost_model.hpp floored_us).
    return (head + max(cost.shape.layers * cost.a_us_per_flop * flops / (dp * cp)
                       + slots * (cost.shape.layers * cost.b_us + cost.micro_batch_fixed_us), cost.floored_us(slots))
            + cost.token_us * outside / (dp * cp))


def lower_bound_us(lengths: Sequence[int], cost: CostModel, dp: int, cp: int, bucket_size: int,
                   timeline: str = "lockstep") -> float:
    """Lower bound on the step time of this global batch on ``timeline``: the classic bound, and
    on lockstep the lockstep-aware one (it holds only there; a free-running step may overlap
    the longest sequence with other ranks' work)."""
    out = classic_bound_us(lengths, cost, dp, cp, bucket_size)
    if timeline == "lockstep":
        out = max(out, lockstep_bound_us(lengths, cost, dp, cp, bucket_size))
    return out


def pool_longest_bound_us(lengths: Sequence[int], cost: CostModel, world: int) -> float:
    """The longest sequence alone: at best its compute over every rank of the world, no exchange."""
    if not lengths:
        return 0.0
    return (cost.shape.layers * cost.comp_us(cost.flops(max(lengths)) / world) + cost.micro_batch_fixed_us
            + cost.token_us * max(lengths) / world + cost.step_fixed_us)


def pool_lower_bound_us(lengths: Sequence[int], cost: CostModel, dp: int, cp: int, bucket_size: int) -> float:
    """Lower bound on the slowest rank's time for any pool plan of this global batch (module docstring)."""
    return max(work_bound_us(lengths, cost, dp, cp, bucket_size), pool_longest_bound_us(lengths, cost, dp * cp))
