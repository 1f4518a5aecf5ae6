"""Tiny random transformers models saved as HF folders (no download): the
one recipe the HF tests share, unit and integration alike."""

import torch


def perturb(model: torch.nn.Module, seed: int) -> None:
    """HF init leaves norms at 1 and biases (Qwen2's QKV bias) at 0, which
    would hide a norm or bias loaded into the wrong place or not trained;
    perturb every parameter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.add_(0.05 * noise)


def folder_factory(tmp_path_factory, cases: dict):
    """``make(case)``: the saved, perturbed tiny model of ``cases[case]``
    (config class, model class, config kwargs), built once per session."""
    folders = {}

    def make(case: str) -> str:
        if case not in folders:
            config_cls, model_cls, kwargs = cases[case]
            torch.manual_seed(0)
            model = model_cls(config_cls(**kwargs))
            perturb(model, seed=1)
            folders[case] = str(tmp_path_factory.mktemp(case))
            model.save_pretrained(folders[case])
        return folders[case]

    return make
