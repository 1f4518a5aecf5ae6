"""Cost-model arithmetic against hand-computed values, presets and profile files."""

import math

import pytest

from skrull_ext._core import CommModel, CostModel, ModelShape
from skrull_ext.scheduler import cost_model as cm
from skrull_ext.scheduler import profile_file, profile_memory


def test_flops_formula_and_crossover():
    c = cm.preset("qwen2.5-0.5b")
    h, hkv = 896, 128
    assert c.flops(1000) == 20 * h * h * 1000 + 4 * h * hkv * 1000 + 4 * h * 1000 * 1000
    # docs/design/cost_model.md: quadratic overtakes linear near 4.6K for 0.5B, ~18K for 7B.
    for name, near in (("qwen2.5-0.5b", 4.6e3), ("qwen2.5-7b", 18e3)):
        shape = cm.MODEL_PRESETS[name]
        crossover = (20 * shape.hidden**2 + 4 * shape.hidden * shape.kv_width) / (4 * shape.hidden)
        assert abs(crossover - near) / near < 0.05
    assert 33 < c.flops(32768) / c.flops(4096) < 35  # "about 34"


def test_kv_bytes_and_comm_interpolation():
    c = CostModel(ModelShape(2, 16, 8, 2), 1e-3, 5.0, CommModel([100.0, 300.0], [10.0, 30.0], 50.0, 4.0, 2.0))
    assert c.kv_bytes(10) == 2 * 10 * 8 * 2
    assert c.collective_us(0) == 0.0
    assert c.collective_us(49) == 4.0  # below threshold: t0
    assert c.collective_us(60) == 10.0  # clamped to the first point
    assert c.collective_us(200) == 20.0  # interpolated
    assert c.collective_us(500) == 50.0  # last segment extended
    assert c.comm_us(200) == 40.0  # two collectives per layer
    assert c.comp_us(0.0) == 0.0
    assert c.comp_us(1000.0) == 6.0


def test_micro_batch_time_overlap_formula():
    c = CostModel(ModelShape(3, 1, 1, 1), 1.0, 0.0, CommModel([1.0], [50.0], collectives_per_layer=1.0))
    # rank 0: local 100 hides comm 50; rank 1: local 20 < comm 50; dist share 10.
    assert c.micro_batch_us([100.0, 20.0], 10.0, 64.0) == 3 * (100 + 10)
    assert c.micro_batch_us([30.0, 20.0], 10.0, 64.0) == 3 * (50 + 10)
    assert c.micro_batch_us([30.0, 20.0], 0.0, 0.0) == 3 * 30


def test_lower_bound_is_below_every_placement(toy):
    import itertools

    from skrull_ext import _core

    lengths = [3, 5, 8]
    lb = toy.micro_batch_lower_bound_us(lengths, 2)
    best = math.inf
    for p in itertools.product([-1, 0, 1], repeat=3):
        r = _core.evaluate_placement(lengths, list(p), toy, 2, 100)
        best = min(best, r.time_us)
    assert 0 < lb <= best


def test_presets_and_errors():
    assert cm.preset("qwen2.5-7b").shape.hidden == 3584
    with pytest.raises(ValueError, match=r"unknown model preset 'gpt5'; choose one of"):
        cm.preset("gpt5")
    with pytest.raises(ValueError, match=r"unknown hardware preset"):
        cm.preset("qwen2.5-7b", "tpu")


def test_profile_round_trip(tmp_path):
    import tomli_w

    c = cm.preset("qwen2.5-7b")
    d = profile_file.to_dict(c, meta={"source": "assumed"})
    p = tmp_path / "p.toml"
    p.write_bytes(tomli_w.dumps(d).encode())
    back = cm.load(p)
    assert back.shape.hidden == 3584 and back.a_us_per_flop == c.a_us_per_flop
    assert list(back.comm.us) == list(c.comm.us)
    assert back.flops(12345) == c.flops(12345)


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda d: d.pop("comm"), r"missing section \[comm\]"),
        (lambda d: d["model"].pop("hidden"), r"missing field model.hidden"),
        (lambda d: d["compute"].update(a=1), r"unknown field compute.a"),
        (lambda d: d.update(extra={}), r"unknown section \[extra\]"),
        (lambda d: d["comm"].update(us=[1.0]), r"comm.bytes and comm.us differ in length"),
    ],
)
def test_bad_profile_rejected_naming_the_field(mutate, msg):
    d = profile_file.to_dict(cm.preset())
    mutate(d)
    with pytest.raises(ValueError, match=msg):
        profile_file.from_dict(d)


def test_bucket_size_from_memory():
    # 80 GB usable, 20 GB static, 2 MB per token, no margin -> 30000 tokens.
    assert profile_memory.derive_bucket_size(80e9, 20e9, 2e6, margin=0.0) == 30000
    assert profile_memory.derive_bucket_size(80e9, 20e9, 2e6, margin=0.1) == 27000
    with pytest.raises(ValueError, match="no room for activations"):
        profile_memory.derive_bucket_size(10e9, 20e9, 2e6)


def test_profile_file_errors_name_the_file(tmp_path):
    import tomli_w

    from skrull_ext.scheduler.profile_file import Profile

    with pytest.raises(ValueError, match=r"profile '.*nope.toml' is not a file"):
        Profile.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[compute\n")
    with pytest.raises(ValueError, match=r"bad.toml: not valid TOML"):
        Profile.load(bad)
    bad.write_bytes(b"\xff\xfe garbage")  # it said only "'utf-8' codec can't decode byte 0xff", no file
    with pytest.raises(ValueError, match=r"bad.toml: not a profile: not UTF-8 text \(byte 0xff at offset 0\)"):
        Profile.load(bad)
    d = profile_file.to_dict(cm.preset())
    d["comm"]["us"] = d["comm"]["us"][1:]  # named when the file is read, not as a shape mismatch when priced
    bad.write_bytes(tomli_w.dumps(d).encode())
    with pytest.raises(ValueError, match=r"bad.toml: comm.bytes and comm.us differ in length \(\d+ vs \d+\); "
                                         r"\[comm\] holds one time per message size"):
        Profile.load(bad)
    with pytest.raises(ValueError, match=r"h100_assumed.toml: a hardware profile \(no \[model\]\) needs the model shape"):
        cm.hardware().cost_model()
    assert cm.hardware().bucket_size is None and cm.hardware().cp == 1
