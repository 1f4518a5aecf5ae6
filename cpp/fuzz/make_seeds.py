"""Seed inputs for the fuzzer, written in fuzz_core.cpp's byte format.

    python cpp/fuzz/make_seeds.py build/fuzz/corpus

Real length distributions (skrull_ext/lengths) under every policy, the
shapes of the adversarial benchmark (skrull_ext/bench/adversarial.py: one
giant plus thousands of tiny, all equal, just above BucketSize/N), a DACP
roll-back that ends in a local placement, a batch one over the sequence
limit, chunked documents, and the tail's options (whole_buffer, slot GDS,
the timelines, fixed costs, extreme chunk counts and times, the TP degree),
and the pool's byte (schedule_pool, the cross-group factor, pool_widen,
collectives_per_layer x plan_margin at its top), and the look-ahead's byte
(windows of 1 to 1,025 batches cut four ways, chunked documents handed out,
the pool as the step planner, a free cost model). tools/fuzz.sh --merge keeps
the ones that add coverage.
"""

from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def ranks(v: int) -> bytes:
    assert 1 <= v <= 9
    return bytes([v - 1])


def bucket(v: int) -> bytes:
    specials = {26624: 5, 13312: 6}
    if v in specials:
        return bytes([160 + specials[v]])
    for sel in range(160):  # 1 + (sel % 64) * (1 if sel % 3 == 0 else 97)
        if 1 + (sel % 64) * (1 if sel % 3 == 0 else 97) == v:
            return bytes([sel])
    raise ValueError(v)


def cost() -> bytes:
    # default shape and coefficients; 10 comm points 2 MB apart; no extras
    return bytes([0, 0, 0, 10]) + bytes([2] * 10) + bytes([0])


def special(case: int) -> bytes:  # length(): sel % 24 == case, sel >= 128
    return bytes([128 + (case - 128 % 24) % 24])


def length(v: int) -> bytes:
    if 1 <= v <= 256:
        return bytes([0, v - 1])
    assert 1 <= v <= 65536
    return bytes([96]) + struct.pack("<H", v - 1)


def lengths(vs: list[int]) -> bytes:
    return bytes([0]) + b"".join(bytes([0]) + length(v) for v in vs)


def run(count: int, enc: bytes) -> bytes:
    return bytes([200]) + struct.pack("<H", count - 1) + enc


def schedule(dp: int, cp: int, b: int, e: int, body: bytes, overlength: int = 1, extra: int = 4, search: int = 0) -> bytes:
    return bytes([0]) + ranks(dp) + ranks(cp) + bucket(b) + bytes([e, overlength, extra, search]) + cost() + body


def main(out: Path) -> None:
    from skrull_ext import lengths as datasets

    out.mkdir(parents=True, exist_ok=True)
    seeds: dict[str, bytes] = {}
    rng = random.Random(7)
    for name in ("mix_sharegpt_conv95+longbench_en5", "longbench_v1_en.est_llama2_tokens", "sharegpt_v3_conversations"):
        pool = [min(65536, s) for s in datasets.load(name)]
        for i, e in enumerate([0x00, 0x10, 0x80 | 0x10, 0x05, 0x15, 0x01, 0x04]):  # placement/rollback/count/refine
            batch = [rng.choice(pool) for _ in range(rng.choice([64, 256]))]
            seeds[f"real_{name.split('.')[0][:20]}_{i}"] = schedule(4, 8, 26624, e, lengths(batch), search=i % 2)
    # Adversarial shapes (skrull_ext/bench/adversarial.py).
    seeds["giant_plus_tiny"] = schedule(1, 8, 26624, 0x10, bytes([254]) + bytes([0]) + special(6) + run(30000, length(1)))
    seeds["all_equal"] = schedule(2, 8, 26624, 0x90, bytes([254]) + run(20000, length(4096)))
    seeds["just_above_bucket_over_n"] = schedule(1, 8, 26624, 0x10, bytes([254]) + run(20000, special(9)))
    seeds["bucket_plus_one_cp2"] = schedule(1, 2, 13312, 0x00, bytes([254]) + run(20000, special(3)))
    seeds["over_limit_truncate"] = schedule(3, 4, 13312, 0x00, lengths([5, 9, 300]) + bytes([0]) + special(7))
    seeds["over_limit_drop"] = schedule(3, 4, 13312, 0x00, lengths([5]) + bytes([0]) + special(7), overlength=2)
    seeds["too_many_sequences"] = schedule(1, 1, 26624, 0x00, bytes([255]))
    seeds["too_many_sequence_ranks"] = bytes([0]) + ranks(1) + bytes([203]) + bucket(26624) + bytes([0, 1, 4, 0]) + cost() + bytes([253])
    # dacp([3, 4, 5], cp=2, bucket=7): the roll-back frees rank 1, and 5
    # then goes whole onto it (a local placement after a roll-back).
    seeds["dacp_local_after_rollback"] = bytes([1]) + ranks(2) + bucket(7) + bytes([0]) + cost() + lengths([3, 4, 5])
    seeds["cp1_real"] = schedule(2, 1, 26624, 0x10, lengths([rng.choice(pool) for _ in range(64)]))
    # dacp, cp = 1, unsorted, one too long for the bucket: nothing to roll back.
    seeds["dacp_cp1_unsorted"] = bytes([1]) + ranks(1) + bucket(7) + bytes([0]) + cost() + lengths([5, 3, 9])
    seeds["dacp_empty_refine"] = bytes([1]) + ranks(2) + bucket(7) + bytes([0x80]) + cost() + lengths([])
    seeds["dacp_too_many"] = bytes([1]) + ranks(2) + bucket(7) + bytes([0]) + cost() + bytes([255])
    # refine: the bottleneck's sequence cannot be sharded (no room on rank 0).
    seeds["dacp_refine_full"] = bytes([1]) + ranks(2) + bucket(98) + bytes([0x80]) + cost() + lengths([60, 90])
    # dacp_for with the shard sweep (margin 0), and dacp_sweep itself.
    seeds["dacp_for_sweep"] = bytes([1]) + ranks(8) + bucket(26624) + bytes([0x40, 1 + 4 * 48]) + cost() + \
        lengths([rng.randint(1, 9000) for _ in range(40)])
    seeds["dacp_sweep_tiny"] = bytes([1]) + ranks(8) + bucket(26624) + bytes([0x20]) + cost() + bytes([254]) + \
        run(3000, length(8))
    # refine shards a lone long sequence: moves reach n.
    seeds["dacp_refine_lone"] = bytes([1]) + ranks(8) + bucket(26624) + bytes([0x80]) + cost() + lengths([20000])
    # Cost edges: 17 bytes per element; negative threshold; floor above the
    # table's first latency (a non-monotone comm model).
    base = bytes([0]) + ranks(2) + ranks(2) + bucket(98) + bytes([0, 1, 4, 0])
    comm = bytes([10]) + bytes([2] * 10)
    seeds["cost_bytes_per_elem_17"] = base + bytes([8, 18, 0, 0]) + comm + bytes([0]) + lengths([5, 50])
    seeds["cost_threshold_negative"] = base + bytes([0, 0, 0]) + comm + bytes([1, 128 + 8]) + lengths([5, 50])
    seeds["cost_not_monotone"] = base + bytes([0, 0, 0]) + comm + bytes([3, 0, 133]) + lengths([5, 50, 97, 300])
    # Chunked documents (overlength "chunk", chunked.hpp) after the lengths: 199 ends them, then a count and
    # each time's index in fuzz_core.cpp's chunked_times (3e7, 1e3, 1e6, 1: the documents dominate); a NaN refused.
    # The same byte's ninths give the chunk passes (1 + (b / 9) % 8): lockstep's pads (chunked.hpp).
    seeds["chunked_documents"] = schedule(4, 2, 13312, 0x10, lengths([5, 900, 17000, 40, 3000, 26000, 8]) +
                                          bytes([199, 4, 5, 2, 3, 1]))
    seeds["chunked_round_robin"] = schedule(2, 1, 26624, 0x10, lengths([7, 9]) + bytes([199, 4, 1, 1, 1, 1]))
    seeds["chunked_lockstep_pads"] = schedule(2, 1, 26624, 0x10, lengths([7, 9, 300]) +
                                              bytes([199, 3, 5 + 9 * 2, 2, 1 + 9 * 4]))  # 3, 1 and 5 passes
    seeds["chunked_bad_time"] = schedule(2, 2, 13312, 0x10, lengths([5, 900]) + bytes([199, 2, 4, 6]))
    # The tail (fuzz_core.cpp's tail()) after the chunked documents: bit 0 whole_buffer, bit 1 slot GDS,
    # bits 2-3 the timeline (0 lockstep, 1 free-running), bit 4 a pad pass's cost and bit 5 a step's (each
    # one more byte, under 128: the typical value), bit 6 the head and the attention weight.
    real = [rng.choice(pool) for _ in range(64)]
    seeds["tail_whole_slot_gds"] = schedule(4, 2, 13312, 0x10, lengths(real) + bytes([199, 0, 0x33, 0, 0]))
    seeds["tail_whole_free"] = schedule(3, 4, 13312, 0x90, lengths(real) + bytes([199, 0, 0x05 | 0x40, 0, 0]))
    seeds["tail_chunked_slot_gds_pads"] = schedule(3, 2, 13312, 0x10, lengths([5, 900, 17000, 40, 3000]) +
                                                   bytes([199, 4, 5 + 9 * 2, 2, 3 + 9 * 7, 1, 0x32, 0, 0]))
    seeds["tail_chunked_per_rank_pads"] = schedule(3, 2, 13312, 0x10, lengths([5, 900, 17000, 40, 3000]) +
                                                   bytes([199, 4, 5 + 9 * 2, 2, 3 + 9 * 7, 1, 0x31, 0, 0]))
    seeds["tail_bad_timeline"] = schedule(2, 2, 13312, 0x10, lengths([5, 900]) + bytes([199, 0, 0x08]))
    seeds["tail_dacp_whole"] = bytes([1]) + ranks(4) + bucket(26624) + bytes([0x80]) + cost() + \
        lengths([rng.randint(1, 9000) for _ in range(30)]) + bytes([199, 0x51, 0, 0, 0])
    # Tail bit 7: each document's extreme chunk count (bits 0-2) and time (bits 3-5). Two documents of
    # 2^31 - 1 chunks at no time on DP rank 0: DP rank 1's pads wrapped in int32 (now refused by name, as
    # are two times of the largest double on one rank, whose sum was infinite).
    seeds["tail_chunk_passes_past_int32"] = schedule(2, 1, 26624, 0x10, lengths([5]) +
                                                     bytes([199, 2, 0, 0, 0x80 | 0x10, 0, 5, 5]))
    seeds["tail_chunked_time_past_limit"] = schedule(1, 1, 26624, 0x10, lengths([5]) +
                                                     bytes([199, 2, 0, 0, 0x80, 3 << 3, 3 << 3]))
    seeds["tail_chunk_passes_at_limit"] = schedule(3, 1, 26624, 0x10, lengths([5, 7]) +
                                                   bytes([199, 1, 0, 0x80 | 0x10, 0, 4 | 1 << 3]))  # 2^30, 1e50 us
    # The tail's last byte: the tensor-parallel degree (bits 0-2: 1, 2, 4, 7, 1024, 1025, 0, -1).
    seeds["tail_tp4_whole_slot_gds"] = schedule(4, 4, 13312, 0x90, lengths(real) + bytes([199, 0, 0x13, 0, 2]))
    seeds["tail_tp1025"] = schedule(2, 2, 13312, 0x10, lengths([5, 900]) + bytes([199, 0, 0x00, 5]))
    seeds["tail_dacp_tp7_whole"] = bytes([1]) + ranks(4) + bucket(26624) + bytes([0x40, 1 + 4 * 48]) + cost() + \
        lengths([rng.randint(1, 9000) for _ in range(30)]) + bytes([199, 0x01, 3])
    # The pool's byte after the TP degree (fuzz_core.cpp's pool_options): bit 0 plans the batch with
    # schedule_pool too; bits 1-3 the cross-group factor (0: 9, 1: 1, 2: 1000, 5: just past 1000, 7: a
    # coefficient), bits 4-6 pool_widen (0: 1, 4: just past 1e6, 7: 1e-3); bit 7 reads one more byte:
    # collectives_per_layer x plan_margin at 125 x 8 (hedged, at the top), or (1) just past it.
    wide = [60000, 5, 900, 17000, 40, 3000, 50000]  # longer than a CP group holds (26,624), within the world
    seeds["pool_real"] = schedule(4, 2, 13312, 0x10, lengths(real) + bytes([199, 0, 0x00, 0, 0x01]))
    seeds["pool_wide_cross1_free"] = bytes([2]) + schedule(4, 2, 13312, 0x10, lengths(wide) +
                                                           bytes([199, 0, 0x04, 0, 0x03]))[1:]
    seeds["pool_wide_cross1000_widen_small"] = schedule(4, 2, 13312, 0x10, lengths(wide + real) +
                                                        bytes([199, 0, 0x04, 0, 0x01 | 2 << 1 | 7 << 4]))
    seeds["pool_dp3_wide_lockstep"] = schedule(3, 4, 13312, 0x10, lengths([65000, 7, 60000] + real[:20]) +
                                               bytes([199, 0, 0x00, 0, 0x01 | 3 << 1]))
    seeds["pool_hedged_top"] = schedule(4, 8, 13312, 0x10, lengths(wide + real) + bytes([199, 0, 0x04, 0, 0x81, 0]))
    seeds["pool_hedged_past_top"] = schedule(4, 2, 13312, 0x10, lengths(wide) + bytes([199, 0, 0x04, 0, 0x81, 1]))
    seeds["pool_cross_past_top"] = schedule(4, 2, 13312, 0x10, lengths(wide) + bytes([199, 0, 0x00, 0, 0x01 | 5 << 1]))
    seeds["pool_widen_past_top"] = schedule(4, 2, 13312, 0x10, lengths(wide) + bytes([199, 0, 0x00, 0, 0x01 | 4 << 4]))
    # A world of 2^16 x 2^16 ranks (rank_count's 204): one sequence is too many for the pool (sequences x
    # world above 2^28) but not for schedule; an empty batch at BucketSize 2^36 (bucket_size's 167) saturates
    # the world's over-length limit; one sequence under slot GDS there saturates a slot's capacity.
    world = bytes([0, 204, 204])
    seeds["pool_world_too_many"] = world + bytes([165, 0x10, 1, 4, 0]) + cost() + lengths([5]) + \
        bytes([199, 0, 0x00, 0, 0x01])
    seeds["pool_world_limit_saturated"] = world + bytes([167, 0x10, 1, 4, 0]) + cost() + bytes([0, 199, 0, 0x00, 0, 0x01])
    seeds["slot_gds_capacity_saturated"] = world + bytes([167, 0x10, 1, 4, 0]) + cost() + lengths([5]) + \
        bytes([199, 0, 0x02, 0, 0x00])
    # The look-ahead's byte after the pool's (fuzz_core.cpp's fuzz_lookahead): the batch becomes a window of W
    # global batches regrouped by skrull::lookahead. Its bits 0-1 cut the batch (0 evenly, 1 all in the last,
    # 2 counts read from the input, 3 round robin), bits 2-3 hand out the chunked documents (1 all to batch 0,
    # 2 round robin, 3 W + 1 lists: refused), bit 4 plans the steps with schedule_pool; 0x80 alone is the
    # plain case (the byte must not be 0). The next byte gives W: 1 + b % 8 below 200, then 0, 16, 1024, 1025
    # and one sample a batch.
    def window(dp: int, cp: int, b: int, batch: list[int], la: int, wb: int, chunked: bytes = bytes([0]),
               tail: int = 0, more: bytes = b"", mode: int = 0, overlength: int = 1) -> bytes:
        head = schedule(dp, cp, b, 0x10, lengths(batch) + bytes([199]) + chunked + bytes([tail, 0, 0, la, wb]) + more,
                        overlength=overlength)
        return bytes([mode]) + head[1:]
    mix = [rng.choice(pool) for _ in range(56)] + [60000, 5, 40000, 7, 30000, 9, 20000, 11]  # a few long ones
    seeds["lookahead_even_w4"] = window(4, 2, 13312, mix, 0x80, 3)
    seeds["lookahead_twice_w8_free"] = window(4, 8, 26624, mix, 0x80 | 3, 7, tail=0x04, mode=2)
    # The CPU debug job's shape (DP 2 x CP 1, 8 short samples a step, windows of 8): the swap search runs.
    short = [rng.randint(16, 2048) for _ in range(60)] + [2048, 2048, 2048, 2048]
    seeds["lookahead_swaps_dp2"] = window(2, 1, 26624, short, 0x80, 7, mode=2)
    seeds["lookahead_counts_slot_gds"] = window(3, 2, 13312, mix, 0x80 | 2, 4, tail=0x02, more=bytes([0, 30, 1, 255]))
    seeds["lookahead_chunked_batch0"] = window(4, 2, 13312, mix, 0x80 | 1 << 2, 3, chunked=bytes([4, 5, 2, 3, 1]))
    seeds["lookahead_chunked_round_robin_lockstep"] = window(2, 1, 26624, short, 0x80 | 2 << 2, 3,
                                                              chunked=bytes([3, 5 + 9 * 2, 2, 1 + 9 * 4]))
    seeds["lookahead_chunked_lists_one_more"] = window(2, 1, 26624, short, 0x80 | 3 << 2, 3, chunked=bytes([1, 2]))
    seeds["lookahead_pool_wide"] = window(4, 2, 13312, wide + mix, 0x80 | 16, 3)
    seeds["lookahead_w1024_last"] = window(2, 2, 13312, short, 0x80 | 1, 202)
    seeds["lookahead_w1025"] = window(2, 2, 13312, short, 0x80, 203)
    seeds["lookahead_w0"] = window(2, 2, 13312, short, 0x80, 200)
    seeds["lookahead_one_sample_a_batch"] = window(2, 2, 13312, short, 0x80 | 3, 204)
    # A free cost model (a = b = 0: cost_model()'s coefficient byte 128): every candidate is estimated 0,
    # so the finalists' tie quantum is 0 and they rank by long samples a step alone.
    free = schedule(2, 1, 26624, 0x10, lengths(short) + bytes([199, 0, 0, 0, 0, 0x80, 3]))
    seeds["lookahead_free_cost"] = free[:9] + bytes([128, 128]) + free[11:]
    seeds["lookahead_over_length_error"] = window(2, 2, 13312, [5, 60000, 7], 0x80, 1, overlength=0)
    # evaluate_placement on a given placement; and one entry short.
    seeds["evaluate_short"] = bytes([3]) + ranks(4) + bucket(26624) + cost() + lengths([5, 7, 9000]) + bytes([199, 0, 1, 9, 7])
    seeds["evaluate"] = bytes([3]) + ranks(4) + bucket(26624) + cost() + lengths([5, 7, 9000]) + bytes([199, 0, 1, 9])
    for name, data in seeds.items():
        (out / f"seed_{name}").write_bytes(data)
    print(f"{len(seeds)} seeds in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/fuzz/corpus"))
