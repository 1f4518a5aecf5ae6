"""Import torchtitan once with third-party import-time warnings silenced.

pyproject turns warnings into errors. torch 2.13 warns on its own import
paths that torchtitan 0.3.0 pulls in (``torch.jit.script_method`` is
deprecated, from torch.utils.mkldnn), which would fail collection of every
test module importing torchtitan. Only these import-time warnings are
silenced; warnings raised while a test runs still fail it.
"""

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import torchtitan.trainer  # noqa: F401
    except ImportError:  # the [train] extra is not installed
        pass
