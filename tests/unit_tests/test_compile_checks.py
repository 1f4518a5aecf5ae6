"""Config-time refusals of what cannot run, for torch.compile and float8:
one line naming the key, before any process group or model is built
(job_checks._check_compile, _check_quantization).

A compiled Skrull job is accepted (DACP attention is a custom op:
attention/compiled.py; tests/integration_tests/test_compile.py trains it).
Float8 needs torchao, which this project does not install, so the float8
converter's output is stood in for by a Linear.Config subclass registered
where torchtitan looks for ``Float8Linear``.
"""

import copy
import dataclasses
import os
import types

import pytest
from torchtitan.components.quantization import float8
from torchtitan.models.common.linear import Linear

from skrull_ext.errors import JobFileError
from skrull_ext.train.job.job_checks import _check_compile, check_job
from skrull_ext.train.job.job_file import load_job

DEBUG = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "debug_cpu.toml")


@pytest.fixture(scope="module")
def job():
    return load_job(DEBUG)


def _compiled(job, **compile_keys):
    config = copy.copy(job)
    config.compile = dataclasses.replace(job.compile, enable=True, **compile_keys)
    return config


def _one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text, text
    return text


def test_compile_accepted_with_skrull_and_without(job):
    for skrull_on in (True, False):
        config = _compiled(job)
        config.skrull = dataclasses.replace(job.skrull, enable=skrull_on)
        check_job(config, world_size=2, on_cpu=True)


def test_compile_refused_without_cpp_compiler(job):
    with pytest.raises(JobFileError) as info:
        _check_compile(_compiled(job), on_cpu=True, cxx_found=lambda: False)
    assert _one_line(info).startswith("compile.enable = True: inductor compiles C++ on CPU and found no compiler")
    _check_compile(_compiled(job), on_cpu=False, cxx_found=lambda: False)  # a GPU's inductor writes Triton


def test_compile_refused_cuda_graph_backend_under_skrull(job):
    with pytest.raises(JobFileError) as info:
        check_job(_compiled(job, backend="cudagraphs"), world_size=1, on_cpu=False)
    assert _one_line(info).startswith("compile.backend = 'cudagraphs': a CUDA graph cannot replay DACP micro-batches")


def test_compile_refused_unknown_backend(job):
    with pytest.raises(JobFileError) as info:
        check_job(_compiled(job, backend="inductr"), world_size=1, on_cpu=True)
    assert _one_line(info).startswith("compile.backend = 'inductr': is not a torch.compile backend")


@dataclasses.dataclass(kw_only=True, slots=True)
class _Float8Config(Linear.Config):
    """What torchtitan's Float8LinearConverter puts in place of a Linear.Config."""


_Float8Config.__qualname__ = "Float8Linear.Config"


def test_float8_refused_under_skrull_naming_the_layer(job, monkeypatch):
    monkeypatch.setattr(float8, "Float8Linear", types.SimpleNamespace(Config=_Float8Config))
    config = copy.copy(job)
    config.model_spec = copy.deepcopy(job.model_spec)
    # The first Linear of the tree, swapped as the converter swaps it.
    fqn, linear, parent, attr = next(config.model_spec.model.traverse(Linear.Config))
    converted = _Float8Config(**{f.name: getattr(linear, f.name) for f in dataclasses.fields(linear) if f.init})
    if isinstance(parent, list):
        parent[attr] = converted
    else:
        setattr(parent, attr, converted)
    with pytest.raises(JobFileError) as info:
        check_job(config, world_size=1, on_cpu=True)
    text = _one_line(info)
    assert text.startswith(f"model_spec.model.{fqn} = 'Float8Linear': quantized linears (torchtitan's "
                           "Float8LinearConverter"), text
    assert "skrull.enable = false" in text
    config.skrull = dataclasses.replace(job.skrull, enable=False)  # torchtitan's own batching: its own feature
    check_job(config, world_size=1, on_cpu=True)
