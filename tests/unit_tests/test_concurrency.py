"""Dataloader workers call the scheduler from many threads at once: the
binding releases the GIL, and each call must give exactly the plan a lone
call gives (no shared state in the core, issue 7)."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from skrull_ext import POLICIES, Scheduler, SchedulerConfig, _core
from skrull_ext.scheduler import cost_model as cm

THREADS = 16


def _cases(n: int, seed: int = 7):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        dp, cp = rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8])
        bucket = rng.choice([512, 4096, 26624])
        limit = _core.max_sequence_length(bucket, cp)
        lengths = [rng.randint(1, limit if rng.random() < 0.05 else max(1, bucket // 4)) for _ in range(rng.randint(0, 400))]
        cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=rng.choice(sorted(POLICIES)), cpsat=False)
        out.append((cfg, lengths))
    return out


def _fingerprint(plan):
    return (plan.digest(), plan.group_time_us, [mb.rank_tokens for mb in plan.micro_batches])


def test_many_threads_get_the_single_threaded_plans():
    cost = cm.preset()
    cases = _cases(48)
    want = [_fingerprint(Scheduler(cfg, cost).schedule(b)) for cfg, b in cases]
    jobs = list(range(len(cases))) * 4
    random.Random(1).shuffle(jobs)
    # One Scheduler (and one CostModel) shared by all threads per case, as a
    # dataloader with worker threads would.
    scheds = [Scheduler(cfg, cost) for cfg, _ in cases]
    with ThreadPoolExecutor(THREADS) as pool:
        got = list(pool.map(lambda i: (i, _fingerprint(scheds[i].schedule(cases[i][1]))), jobs))
    for i, fp in got:
        assert fp == want[i], f"case {i} differs when run concurrently"


def test_concurrent_dacp_calls_match():
    cost = cm.preset()
    rng = random.Random(3)
    cases = [([rng.randint(1, 3000) for _ in range(rng.randint(1, 200))], rng.choice([2, 4, 8])) for _ in range(64)]
    want = [list(_core.dacp(b, cost, cp, 4096).cp_rank) for b, cp in cases]
    with ThreadPoolExecutor(THREADS) as pool:
        got = list(pool.map(lambda c: list(_core.dacp(c[0], cost, c[1], 4096).cp_rank), cases * 3))
    assert got == want * 3


def test_changing_options_from_another_thread_cannot_corrupt_a_running_call():
    # Found by this suite: the binding read Options and CostModel by
    # reference after releasing the GIL, so another thread setting
    # options.cp mid-call made the core index past its buffers (segfault).
    # They are now copied before the GIL is released.
    cost = cm.preset()
    rng = random.Random(0)
    batch = [rng.randint(1, 4096) for _ in range(20000)]
    opts = _core.Options()
    opts.bucket_size = 4096
    shapes = [(dp, cp) for dp in (1, 3) for cp in (2, 64)]
    want = set()
    for dp, cp in shapes:
        opts.dp, opts.cp = dp, cp
        s = _core.schedule(batch, cost, opts)
        want.add((tuple(s.dp_rank), tuple(s.cp_rank), tuple(s.micro_batch)))
    stop = threading.Event()

    def flip():
        i = 0
        while not stop.is_set():
            opts.dp, opts.cp = shapes[i % 4]
            i += 1

    t = threading.Thread(target=flip)
    t.start()
    try:
        for _ in range(40):
            s = _core.schedule(batch, cost, opts)
            assert (tuple(s.dp_rank), tuple(s.cp_rank), tuple(s.micro_batch)) in want
    finally:
        stop.set()
        t.join()


def test_schedule_releases_the_gil():
    # While one thread is inside the core, another keeps running Python. Read as
    # CPU time of each thread (time.thread_time), not wall-clock gaps: another
    # process's load slows both threads alike, but a core holding the GIL would
    # leave the main thread no CPU at all while it runs.
    cost = cm.preset()
    opts = _core.Options()
    opts.cp = 8
    rng = random.Random(0)
    batch = [rng.randint(1, 8000) for _ in range(400_000)]  # about 0.1-0.2 s in the core
    spinning = threading.Event()
    done = threading.Event()
    worker_cpu = []

    def work():
        # The call starts only once the main thread runs: on a loaded box a thread woken from a
        # wait may get the CPU late, and a call that ran before it would read as a held GIL.
        spinning.wait()
        t0 = time.thread_time()
        _core.schedule(batch, cost, opts)
        worker_cpu.append(time.thread_time() - t0)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    t0 = time.thread_time()
    spinning.set()
    spins = 0
    while not done.is_set():
        spins += 1
    main_cpu = time.thread_time() - t0
    t.join()
    # Held GIL: the main thread would get the GIL back only between bytecodes of the
    # worker before and after the call, a few switch intervals, not a share of the call.
    assert spins > 100
    assert main_cpu > 0.25 * worker_cpu[0], (main_cpu, worker_cpu[0])