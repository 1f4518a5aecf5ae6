"""The CUDA allocator settings every entry point resolves (skrull_ext/train/allocator.py)."""

from skrull_ext.train.allocator import EXPANDABLE, use_expandable_segments


def test_expandable_segments_set_when_the_user_chose_nothing():
    env = {}
    line = use_expandable_segments(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} and EXPANDABLE in line
    assert line.startswith("CUDA allocator: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (skrull_ext's default")


def test_the_users_settings_win_under_either_name():
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env = {name: "max_split_size_mb:128"}
        line = use_expandable_segments(env)
        assert env == {name: "max_split_size_mb:128"}  # untouched, nothing added
        assert line == f"CUDA allocator: {name}=max_split_size_mb:128 (set by you; skrull_ext leaves it as it is)"
    env = {"PYTORCH_CUDA_ALLOC_CONF": ""}  # empty: not a choice
    use_expandable_segments(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == EXPANDABLE
