"""Models a job can name: ``registry`` (the ``[model]`` families and flavors),
``decoders`` (torchtitan decoder configs at any size) and ``fqn`` (module
names without the wrappers torch adds)."""
