"""Models a job can name: ``registry`` (the ``[model]`` families and flavors),
``decoders`` (torchtitan decoder configs at any size), ``hf_config`` (a HF
folder's config.json <-> those decoders), ``qwen2_adapter`` (the Qwen2
state-dict adapter torchtitan lacks) and ``fqn`` (module names without the
wrappers torch adds).

Everything that turns a ``[model]`` section into a ModelSpec is here, below
``hf`` (weights and folders), so nothing in this room imports upward."""
