"""Free-running steps (``[skrull] free_running``): FSDP parameters unsharded for the whole step.

torchtitan shards every parameter with FSDP2 over the dp_shard x cp mesh. By
default each micro-batch all-gathers each unit's parameters in forward (and
again in backward after a reshard), so every rank of that mesh must run the
same number of passes: a DP rank with fewer micro-batches runs pad passes
(data/steps/loader.py). In a free-running step the parameters are
all-gathered once, in the rank's first forward, and kept unsharded until its
last backward; gradients accumulate unsharded and are reduce-scattered once,
in that last backward, which also reshards. Between the first forward and
the last backward a rank shares no collective with the other DP ranks (its
DACP exchange is within its CP group), so each DP rank runs its own
micro-batches back to back: the timeline the scheduler plans for when
``config.job_timeline`` says "free".

Every rank still runs at least one pass (the dataloader gives a rank with no
micro-batch one pad), so the all-gathers of the first forward and the
reduce-scatters of the last backward are matched on every rank, in the same
unit order.

FSDP2 (torch 2.13) has setters for the three switches and no getters;
torchtitan sets reshard-after-forward per unit (the last block and the root
keep their parameters after forward), so ``begin`` saves each unit's setting
(private ``FSDPState``/``FSDPParamGroup`` fields) and ``end`` puts it back,
so forwards outside a training step (validation) run as torchtitan's.
``end`` also checks that every unit is resharded before the optimizer
steps: an unsharded parameter left over would be a stale copy in the next
step's forward (the optimizer updates the shards).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from torch.distributed.fsdp import FSDPModule

__all__ = ["FreeRunningFSDP", "after_forward_only"]


def _param_groups(unit: FSDPModule) -> list:
    """The unit's FSDP parameter groups: a list on torch >= 2.13 (``_fsdp_param_groups``),
    at most one on torch 2.11-2.12 (``_fsdp_param_group``, None for a unit without
    parameters). Gated on the attribute, not the version."""
    state = unit._get_fsdp_state()
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    group = state._fsdp_param_group
    return [] if group is None else [group]


def after_forward_only(model_parts: Iterable[nn.Module]) -> None:
    """Put FSDP back as a backward leaves it, after forward passes with none (validation).

    Each forward appends its units to the root's backward-prefetch order
    (``post_forward_order``, and each group's ``_post_forward_indices``), which
    only a backward's final callback clears, and the root keeps its parameters
    unsharded for the backward it expects. After a forward-only pass the next
    training backward prefetched from the stale order: where DP ranks ran
    different micro-batch counts (a free-running step right after validation)
    they all-gathered and reduce-scattered different units at the same time
    (gloo: "Received data size doesn't match expected size", the text job at
    DP 2 with validation.freq 4). torch >= 2.13 has ``reset_iter_state`` on the
    root for exactly this; before it, the same trackers are cleared here.
    """
    for part in model_parts:
        if not isinstance(part, FSDPModule) or part._get_fsdp_state()._is_root is not True:
            continue
        if hasattr(part, "reset_iter_state"):  # torch >= 2.13
            part.reset_iter_state()
        else:
            _clear_forward_trackers(part)


def _clear_forward_trackers(root: FSDPModule) -> None:
    """Before torch 2.13: what ``reset_iter_state`` clears that a forward sets (tested on 2.13 too)."""
    state = root._get_fsdp_state()
    for unit in root.modules():
        if isinstance(unit, FSDPModule):
            for group in _param_groups(unit):
                group._post_forward_indices.clear()
            unit.reshard()
    for group in _param_groups(root):
        group.comm_ctx.post_forward_order.clear()
    state._state_ctx.iter_forward_root = None


class FreeRunningFSDP:
    """Switches the FSDP units of ``model_parts`` for one free-running step:
    ``begin()`` before the first micro-batch, ``last()`` before the rank's last
    one (the first may be the last), ``end()`` after it, before the optimizer."""

    def __init__(self, model_parts: Iterable[nn.Module]) -> None:
        model_parts = list(model_parts)
        self.roots = [part for part in model_parts if isinstance(part, FSDPModule)]
        self.units: list[FSDPModule] = []
        seen: set[int] = set()
        for part in model_parts:
            for m in part.modules():
                if isinstance(m, FSDPModule) and id(m) not in seen:
                    seen.add(id(m))
                    self.units.append(m)
        self._saved: list[tuple[object, bool | None, list, list[object]]] | None = None

    def __bool__(self) -> bool:
        return bool(self.units)

    def begin(self) -> None:
        """Keep every unit's parameters unsharded after forward and backward, and its
        gradients unsynchronised (accumulated unsharded), from the first forward on."""
        for root in self.roots:
            # FSDP decides the root (whose parameters it keeps after forward) at its lazy init,
            # in the first forward; do it now, from the root (a unit lazily initialised first
            # would take itself for the root), so the settings saved are the ones it runs.
            root._get_fsdp_state()._lazy_init()
        self._saved = []
        for unit in self.units:
            state, groups = unit._get_fsdp_state(), _param_groups(unit)
            self._saved.append((state, state._auto_reshard_after_forward, groups,
                                [g.post_forward_mesh_info for g in groups]))
        for unit in self.units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.set_reshard_after_backward(False, recurse=False)
            unit.set_requires_gradient_sync(False, recurse=False)

    def last(self) -> None:
        """The rank's last micro-batch: its backward reduce-scatters the accumulated
        gradients (once per step) and reshards every unit."""
        for unit in self.units:
            unit.set_requires_gradient_sync(True, recurse=False)
            unit.set_reshard_after_backward(True, recurse=False)

    def end(self) -> None:
        """After the last backward: torchtitan's reshard-after-forward settings back, and
        every unit must be resharded (RuntimeError naming the first that is not)."""
        if self._saved is not None:
            for state, auto, groups, infos in self._saved:
                state._auto_reshard_after_forward = auto
                for group, info in zip(groups, infos, strict=True):
                    group.post_forward_mesh_info = info
            self._saved = None
        for unit in self.units:
            unit.set_requires_gradient_sync(True, recurse=False)
            unit.set_reshard_after_backward(True, recurse=False)
        for unit in self.units:
            for group in _param_groups(unit):
                if not group.is_sharded:
                    raise RuntimeError(
                        f"free-running step: FSDP unit {type(unit).__name__} "
                        f"({getattr(group, '_module_fqn', '?')}) still holds unsharded parameters after the "
                        "last backward; the next step would use a stale copy"
                    )

    def unsharded(self) -> list[str]:
        """Units whose parameters are unsharded now (for tests and checks)."""
        return [type(u).__name__ for u in self.units
                for g in _param_groups(u) if not g.is_sharded]
