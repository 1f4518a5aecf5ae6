"""Turn a torchtitan DCP checkpoint into a HF model folder.

    python -m skrull_ext.export CHECKPOINT_DIR OUT_DIR --config-file JOB.toml
    python -m skrull_ext.export CHECKPOINT_DIR OUT_DIR --hf-path SRC [--dtype bfloat16] [--overwrite]

``CHECKPOINT_DIR`` is one step of a job's checkpoint folder
(``<dump_folder>/checkpoint/step-N``, written mid-run by ``[checkpoint]
interval``); the job file, or the HF folder the job started from, says which
model it holds. ``OUT_DIR`` gets ``model.safetensors`` (HF key names and
layouts, through the model spec's state-dict adapter), config.json and the
tokenizer files (skrull_ext/hf/folder.py), which is what
``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads. The
final checkpoint of a job with ``[checkpoint] last_save_in_hf = true`` is
such a folder already. ``OUT_DIR`` must be new or empty: a folder holding
anything is refused before the checkpoint is read, unless ``--overwrite``
(its contents are then replaced, so no file of another model stays beside
the new weights).

Only the model's tensors are read (not the optimizer's), into plain CPU
tensors: no process group is made. Before anything is read, the
checkpoint's index is compared with the model: a missing tensor or a shape
that differs fails naming the checkpoint, the tensor and the model.

A LoRA job's checkpoint (``--config-file`` of a job with ``[lora]``) holds
the frozen base and the trained adapters; the folder written is the merged,
trained model (W + alpha / r * B @ A, skrull_ext/lora/peft_io.py), as the
run's own ``lora_merged`` folder. The adapters' scale is in the job file, not
in the checkpoint, so a checkpoint holding adapters exported with
``--hf-path`` (or with a job file without ``[lora]``) is refused rather than
written without them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from skrull_ext.scheduler.model_shape import DTYPES


class ExportError(ValueError):
    """The checkpoint is missing or does not hold the model named."""


def _model_tensors(checkpoint_dir: str, spec) -> dict[str, torch.Tensor]:
    """The model's tensors of a DCP checkpoint (torchtitan FQNs), checked first."""
    if not os.path.isdir(checkpoint_dir):
        raise ExportError(f"{checkpoint_dir}: no such checkpoint folder")
    if not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        hint = (" (it holds *.safetensors: already HF weights, saved by last_save_in_hf)"
                if any(f.endswith(".safetensors") for f in os.listdir(checkpoint_dir)) else "")
        raise ExportError(f"{os.path.join(checkpoint_dir, '.metadata')}: not found, so not a DCP checkpoint{hint}")
    stored = FileSystemReader(checkpoint_dir).read_metadata().state_dict_metadata
    with torch.device("meta"):
        expected = spec.model.build().state_dict()
    model = f"{spec.name}/{spec.flavor}"
    adapters = [name for name in stored if _is_adapter(name) and name not in expected]
    if adapters:
        more = f" and {len(adapters) - 1} more" if len(adapters) > 1 else ""
        raise ExportError(
            f"{checkpoint_dir}: holds LoRA adapters ({adapters[0]!r}{more}), but the model "
            f"named ({model}, no [lora]) has none; export it with --config-file JOB, the [lora] job that trained it "
            "(its lora.alpha scales the adapters), or use that run's lora_merged or lora_adapter folder"
        )
    tensors = {}
    for name, meta_tensor in expected.items():
        if name not in stored:
            raise ExportError(f"{checkpoint_dir}: tensor {name!r} of {model} is not in the checkpoint")
        info = stored[name]
        shape = tuple(getattr(info, "size", ()))
        if shape != tuple(meta_tensor.shape):
            raise ExportError(
                f"{checkpoint_dir}: tensor {name!r} has shape {list(shape)}, but {model} has "
                f"{list(meta_tensor.shape)} (a checkpoint of another model?)"
            )
        tensors[name] = torch.empty(shape, dtype=info.properties.dtype)
    load_single_process(tensors, checkpoint_dir)
    return tensors


def _is_adapter(name: str) -> bool:
    """A LoRA adapter weight of the model (not its optimizer state, ``optimizer.state.<fqn>.exp_avg``)."""
    return name.endswith((".lora_a.weight", ".lora_b.weight")) and not name.startswith("optimizer.")


def _hf_tensors(tensors: dict[str, torch.Tensor], spec) -> dict[str, torch.Tensor]:
    """The HF state dict of the model's tensors; a LoRA model's adapters folded in."""
    if getattr(spec, "lora", None) is None:
        return spec.state_dict_adapter(spec.model, None).to_hf(tensors)
    from skrull_ext.lora.peft_io import merged_hf_state_dict

    with torch.device("meta"):
        model = spec.model.build()
    model.load_state_dict(tensors, assign=True)  # the loaded tensors become the parameters: no copy
    return merged_hf_state_dict(model, spec)


def load_single_process(state_dict: dict, checkpoint_dir: str) -> None:
    """``dcp.load`` in one process without a process group (its warning that it
    assumes so is the intent here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state_dict, checkpoint_id=checkpoint_dir, no_dist=True)


def export(checkpoint_dir: str, out_dir: str, config, dtype: str = "float32", overwrite: bool = False) -> list[str]:
    """Write the HF folder of ``checkpoint_dir`` (a step of ``config``'s job) to
    ``out_dir`` (new or empty; ``overwrite``: its contents replaced once the checkpoint
    is read, ``check_out_dir``); returns the names of the files written."""
    replace = check_out_dir(out_dir, checkpoint_dir, overwrite)
    from skrull_ext.hf.folder import HFExport
    from skrull_ext.lora import apply_lora

    apply_lora(config)  # a [lora] job's model has the adapters its checkpoint holds
    spec = config.model_spec
    files = HFExport.for_job(config)
    hf = _hf_tensors(_model_tensors(checkpoint_dir, spec), spec)
    if replace:
        clear_dir(out_dir)
    return files.write(out_dir, hf, dtype)


def check_out_dir(out_dir: str, checkpoint_dir: str, overwrite: bool) -> bool:
    """Refuse (ExportError, one line) an ``out_dir`` that is a file, one that holds the
    checkpoint read, or a folder that is not empty unless ``overwrite``. Returns whether
    it has contents to replace (``clear_dir`` before writing: files left from another
    model beside the new weights would be loaded with them)."""
    if os.path.isfile(out_dir):
        raise ExportError(f"{out_dir}: is a file; name a folder to write the HF model into")
    entries = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    if not entries:
        return False
    out, ckpt = os.path.realpath(out_dir), os.path.realpath(checkpoint_dir)
    if ckpt == out or ckpt.startswith(out + os.sep):
        raise ExportError(f"{out_dir}: holds the checkpoint {checkpoint_dir} being exported; name another folder")
    if not overwrite:
        more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
        raise ExportError(f"{out_dir}: is not empty ({entries[0]!r}{more}); name a new or empty folder, or add "
                          "--overwrite to replace its contents")
    return True


def clear_dir(folder: str) -> None:
    """Remove everything in ``folder`` (not the folder)."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def job_config(config_file: str | None, hf_path: str | None):
    """The job config that names the checkpoint's model."""
    from skrull_ext.train.job.job_file import base_config, load_job

    if config_file is not None:
        return load_job(config_file)
    from skrull_ext.hf.job import hf_job_defaults
    from skrull_ext.models.registry import build_model_spec

    return hf_job_defaults(base_config(build_model_spec(hf_path=hf_path)), hf_path)


def main(argv: list[str] | None = None) -> int:
    from skrull_ext.hf.folder import files_said
    from torchtitan_patches import logs

    logs.install()  # without torchtitan's warnings about its own defaults (initial_load_model_only, ...)
    ap = argparse.ArgumentParser(prog="python -m skrull_ext.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint_dir", help="a DCP checkpoint step folder, e.g. outputs/job/checkpoint/step-500")
    ap.add_argument("out_dir", help="the HF folder to write")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-file", help="the job file that wrote the checkpoint")
    src.add_argument("--hf-path", help="the HF folder the job started from ([model] hf_path)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the saved weights (default float32)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the contents of OUT_DIR if it is not empty (default: refuse it)")
    args = ap.parse_args(argv)
    try:
        check_out_dir(args.out_dir, args.checkpoint_dir, args.overwrite)  # before the job is read
        config = job_config(args.config_file, args.hf_path)
        written = export(args.checkpoint_dir, args.out_dir, config, args.dtype, args.overwrite)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    merged = " (the LoRA adapters merged into the base)" if getattr(config.model_spec, "lora", None) else ""
    print(f"wrote {args.out_dir}: {files_said(written).replace('model.safetensors', 'model.safetensors' + merged, 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
