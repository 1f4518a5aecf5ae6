"""Installed beside ``skrull_ext_compat.pth`` in site-packages: on the first
``import torchtitan`` of any process, put torchtitan_patches.compat's
import-time shims in place first.

Why a hook: ``python -m torchtitan.train --module skrull_ext.train`` imports
torchtitan's trainer (and through it ``torch.distributed.fsdp.DataParallelMeshDims``,
absent before torch 2.13) before any skrull-ext code runs. skrull-ext's own
entry points call ``compat.install_import_shims()`` themselves; this covers
torchtitan's. It costs nothing until torchtitan is imported: no torch import
at start-up, and a no-op after the first import (it stays in sys.meta_path:
removing itself while the import system walks that list would skip the
finder after it).
"""

import importlib.abc
import sys


class _BeforeTorchtitan(importlib.abc.MetaPathFinder):
    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "torchtitan" and not self.done:
            self.done = True
            try:
                from torchtitan_patches import compat  # imports torch, not torchtitan

                compat.install_import_shims()
            except ImportError:  # torch or the package gone: torchtitan's own error will say
                pass
        return None  # the normal finders load torchtitan


if not any(isinstance(f, _BeforeTorchtitan) for f in sys.meta_path):
    sys.meta_path.insert(0, _BeforeTorchtitan())
