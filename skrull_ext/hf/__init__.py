"""HF model folders in and out: safetensors <-> torchtitan state dict
(``weights``), folders written and checked (``folder``, ``checks``) and a
job's defaults from a folder (``job``). Reading config.json into a ModelSpec
is ``skrull_ext.models.hf_config``, a floor below, where the registry needs it."""
