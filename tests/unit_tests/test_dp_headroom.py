"""tools/dp_headroom.py reads a simulate run's results.json and rebuilds its global batches."""

import json

from skrull_ext.bench import simulate
from tests.unit_tests.tool_module import load_tool


def _tool():
    return load_tool("dp_headroom")


def _pct(cell: str) -> float:
    return float(cell.strip(" *%"))


def test_headroom_is_within_the_gap(tmp_path, capsys):
    out = tmp_path / "sim"
    simulate.main(["--datasets", "sharegpt_v3_conversations.qwen,wikipedia", "--models", "qwen2.5-0.5b",
                   "--iterations", "3", "--policies", "skrull", "--out", str(out), "--no-plots", "--quiet"])
    capsys.readouterr()
    for policy in ("skrull", "baseline"):
        assert _tool().main([str(out / "results.json"), "--policy", policy]) == 0
        rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
        assert len(rows) == 3 and rows[-1][0].strip() == "**mean**"
        gaps = {r[0].strip(): _pct(r[1]) for r in rows[:-1]}
        assert set(gaps) == {"sharegpt_v3_conversations.qwen / qwen2.5-0.5b", "wikipedia / qwen2.5-0.5b"}
        for r in rows:
            assert 0.0 <= _pct(r[3]) <= _pct(r[1]) + 0.05  # headroom never exceeds the gap
        data = json.loads((out / "results.json").read_text())
        want = {f"{c['dataset']} / {c['model']}": 100 * c["gap_to_bound"] for c in data["cells"] if c["policy"] == policy}
        assert all(abs(gaps[k] - round(want[k], 1)) < 0.051 for k in gaps)
