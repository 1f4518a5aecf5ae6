"""Where the test suite's wall time goes, per xdist worker: a pytest plugin that records each test's
start and end in each worker, and a report of what it recorded.

    SUITE_TIMELINE=/tmp/t.jsonl PYTHONPATH=tools PYTEST_PLUGINS=suite_timeline python -m pytest
    python tools/suite_timeline.py /tmp/t.jsonl [--files 30]

The pytest command stays CI's own (the plugin comes in through the environment, in the controller
and in every worker). The report gives each worker's busy time and when it finished (the suite's
wall time is the later one; the gap between them is what a better balance could win), then the
files by their summed test time (setup and teardown included: a module or session fixture counts
in the first test that uses it) with the worker that ran them. Why: the CI runs at the 15-minute
line, and the choice between balancing the workers and cutting work needs both figures
(docs/reliability.md, "The suite's time").
"""

import argparse
import collections
import json
import os
import time

_OUT = "SUITE_TIMELINE"


def _record(event: str, **fields) -> None:
    path = os.environ.get(_OUT)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not path or not worker:  # the controller reports what the workers ran; only the workers time it
        return
    with open(path, "a") as f:
        f.write(json.dumps({"ev": event, "worker": worker, "t": time.time(), **fields}) + "\n")


def pytest_sessionstart(session):
    _record("sessionstart")


def pytest_runtest_logstart(nodeid, location):
    _record("start", id=nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _record("end", id=nodeid)


def report(path: str, files: int) -> str:
    started, spans = {}, []
    first, last = {}, {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            w = r["worker"]
            if r["ev"] == "sessionstart":
                first.setdefault(w, r["t"])
            elif r["ev"] == "start":
                started[(w, r["id"])] = r["t"]
            elif r["ev"] == "end" and (w, r["id"]) in started:
                spans.append((w, r["id"], r["t"] - started[(w, r["id"])]))
                last[w] = r["t"]
    t0 = min(first.values())
    out = []
    for w in sorted(last):
        busy = sum(d for ww, _, d in spans if ww == w)
        out.append(f"{w}: {busy:.0f} s of tests, last one ended {last[w] - t0:.0f} s after the first worker started")
    ends = [last[w] - t0 for w in last]
    out.append(f"tests' summed time {sum(d for *_, d in spans):.0f} s; the workers ended {max(ends) - min(ends):.0f} s apart")
    by_file, where = collections.Counter(), collections.defaultdict(set)
    for w, nodeid, d in spans:
        name = nodeid.split("::")[0]
        by_file[name] += d
        where[name].add(w)
    out += [f"{d:8.1f} s  {','.join(sorted(where[name]))}  {name}" for name, d in by_file.most_common(files)]
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timeline", help="the JSON lines file SUITE_TIMELINE named")
    p.add_argument("--files", type=int, default=30, help="files listed, the costliest first (default: %(default)s)")
    a = p.parse_args()
    print(report(a.timeline, a.files))
