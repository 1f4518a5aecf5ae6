"""Which checkpoint a run continues from, checked before any model is built.

torchtitan 0.3.0 continues a run from the newest ``step-N`` under
``<dump_folder>/<checkpoint.folder>`` (or ``checkpoint.load_step``), and
counts a HF model folder (``model.safetensors.index.json``) as one. But the
last save of a ``last_save_in_hf`` job is model weights only: loading it as a
training state fails deep in DCP (``step-N/.metadata`` not found, a
traceback per rank). ``check_continue`` says so in one line naming
``--checkpoint.load_step`` and the last full checkpoint to give it, or, when
there is none, how to start from the HF folder instead; and a ``load_step``
with no ``step-N`` folder names the steps there are. A run whose checkpoint
is already at ``training.steps`` (a finished run launched again) has nothing
left to train: ``NothingToTrain``, one line, exit 0, before any model is built.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from skrull_ext.errors import JobFileError, NothingToTrain

__all__ = ["Continued", "check_continue", "dataloader_keys", "saved_steps"]


@dataclass(frozen=True)
class Continued:
    """The full checkpoint a run continues from, and its dataloader state's keys as read once
    here (None: unreadable here, DCP's own load says why); the trainer hands them to the loader
    (data/steps/base.py ``expect_checkpoint``)."""

    path: str
    dataloader_keys: set[str] | None


def saved_steps(folder: str) -> tuple[list[int], list[int]]:
    """(full checkpoint steps, HF model folder steps) under ``folder``, ascending;
    as torchtitan's ``_find_load_step`` counts them (``.metadata`` or a HF index)."""
    full, hf = [], []
    try:
        names = os.listdir(folder)
    except OSError:
        return full, hf
    for name in names:
        m = re.fullmatch(r"step-(\d+)", name)
        if not m:
            continue
        path = os.path.join(folder, name)
        if os.path.isfile(os.path.join(path, ".metadata")):
            full.append(int(m.group(1)))
        elif os.path.isfile(os.path.join(path, "model.safetensors.index.json")):
            hf.append(int(m.group(1)))
    return sorted(full), sorted(hf)


def check_continue(config) -> Continued | None:
    """Raise JobFileError when the checkpoint this run would load cannot continue it; else the
    full checkpoint whose training state it continues (None: a fresh start, weights only, a
    step-0 seed checkpoint, or a remote folder)."""
    ckpt = config.checkpoint
    if not ckpt.enable or ckpt.create_seed_checkpoint or "://" in ckpt.folder:
        return None
    folder = os.path.join(config.dump_folder, ckpt.folder)
    full, hf = saved_steps(folder)
    load = max(full + hf, default=-1) if ckpt.load_step == -1 else ckpt.load_step
    steps = config.training.steps
    if load >= steps and load in full + hf:
        raise NothingToTrain(f"nothing left to train: {folder}/step-{load} is at step {load} of {steps} "
                             f"(training.steps); raise training.steps (e.g. --training.steps {load + steps}) "
                             f"to train on from it")
    if load == 0:  # torchtitan loads a step-0 (seed) checkpoint's model only
        return None
    if ckpt.load_step == -1:
        step = max(full + hf, default=-1)
        if step not in hf:
            if step in full:
                return _check_dataloader_keys(os.path.join(folder, f"step-{step}"))
            # torchtitan's initial load of a whole training state (model_only false) from another folder
            initial = ckpt.initial_load_path
            whole = initial and not ckpt.initial_load_model_only and not ckpt.initial_load_in_hf
            return _check_dataloader_keys(initial) if whole and os.path.isfile(os.path.join(initial, ".metadata")) \
                else None
        given = "the newest checkpoint (checkpoint.load_step = -1)"
    else:
        step = ckpt.load_step
        if step in full:
            return _check_dataloader_keys(os.path.join(folder, f"step-{step}"))
        if step not in hf:
            raise JobFileError(f"checkpoint.load_step = {step}: there is no {folder}/step-{step} "
                               f"(full checkpoints: {full or 'none'})")
        given = f"checkpoint.load_step = {step}"
    earlier = [s for s in full if s < step]
    if earlier:
        how = f"continue from the last full checkpoint with --checkpoint.load_step {earlier[-1]}"
    else:
        how = (f"there is no full checkpoint to continue from ([checkpoint] interval saves them); to train "
               f"it further, start a new run in another dump_folder with --checkpoint.initial_load_path "
               f"{os.path.abspath(os.path.join(folder, f'step-{step}'))} --checkpoint.initial_load_in_hf")
    raise JobFileError(f"{given}: {folder}/step-{step} is the HF model folder a run saved last "
                       f"(checkpoint.last_save_in_hf), model weights only, no training state; {how}")


NEW_DATALOADER_KEYS = {"lookahead": "2026-11-28: the look-ahead windows a run trained, data/steps/windows.py"}
"""Dataloader state keys later versions added (DCP loads the keys of the fresh loader's state,
so a checkpoint without one fails deep in DCP with ``Missing key in checkpoint state_dict``)."""


def dataloader_keys(path: str) -> set[str] | None:
    """The keys of the dataloader state in the full checkpoint at ``path`` (None: unreadable here,
    DCP's own load says why)."""
    try:
        from torch.distributed.checkpoint import FileSystemReader

        keys = set(FileSystemReader(path).read_metadata().state_dict_metadata)
    except Exception:  # noqa: BLE001 - unreadable here: DCP's own load says why
        return None
    return {k.split(".", 1)[1] for k in keys if k.startswith("dataloader.")}


def _check_dataloader_keys(path: str) -> Continued:
    """Refuse, in one line, a full checkpoint whose dataloader state lacks a key this version saves
    (``data_order``, which a checkpoint may lack, is not one: the trainer tells the loader, which
    leaves it out of the load, data/steps/data_order.py); else ``path`` and the keys read."""
    saved = dataloader_keys(path)
    if saved is None:
        return Continued(path, None)
    missing = sorted(set(NEW_DATALOADER_KEYS) - saved)
    if saved and missing:  # a checkpoint with no dataloader state has no key to miss
        raise JobFileError(
            f"{path}: its dataloader state has no {', '.join(missing)} (added "
            f"{'; '.join(NEW_DATALOADER_KEYS[k] for k in missing)}), so this version cannot continue its "
            f"data where it stopped; train on from its weights in a new dump_folder with "
            f"--checkpoint.initial_load_path {os.path.abspath(path)} --checkpoint.initial_load_model_only, "
            f"or continue it with the version that saved it")
    return Continued(path, saved)
