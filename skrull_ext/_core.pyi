"""Type stubs of the compiled scheduler core (cpp/src/bindings.cpp)."""

from collections.abc import Sequence
from enum import Enum
from typing import overload

__version__: str
DISTRIBUTED: int
DROPPED: int
MAX_LENGTH: int
RECOMPUTE_SHARE: float
MAX_BUCKET_SIZE: int
MAX_SEQUENCES: int
MAX_SEQUENCE_RANKS: int
MAX_RANKS: int
MAX_PLAN_MARGIN: float
MAX_LOOKAHEAD: int

class Status(Enum):
    OK = 0
    UNSCHEDULABLE = 1

class Placement(Enum):
    LEAST_LOAD = 0
    WORST_FIT = 1

class Rollback(Enum):
    LONGEST = 0
    SHORTEST = 1

class MicroBatchCount(Enum):
    SMALLEST_FEASIBLE = 0
    PREDICTED_TIME = 1

class DacpSearch(Enum):
    HEURISTIC = 0
    SHARD_SWEEP = 1

class Overlength(Enum):
    ERROR = 0
    TRUNCATE = 1
    DROP = 2

class ModelShape:
    layers: int
    hidden: int
    kv_width: int
    bytes_per_elem: int
    tp: int
    def __init__(self, layers: int, hidden: int, kv_width: int, bytes_per_elem: int = 2, tp: int = 1) -> None: ...

class CommModel:
    bytes: list[float]
    us: list[float]
    threshold_bytes: float
    floor_us: float
    collectives_per_layer: float
    cross_group_factor: float  # exchange across CP groups over the same bytes inside one (skrull-pool)
    plan_margin: float  # decide with every exchange at this multiple of its price, price at 1x (hedge.hpp)
    def __init__(self, bytes: Sequence[float], us: Sequence[float], threshold_bytes: float = 0.0,
                 floor_us: float = 0.0, collectives_per_layer: float = 2.0, cross_group_factor: float = 9.0,
                 plan_margin: float = 1.0) -> None: ...

class CostModel:
    shape: ModelShape
    a_us_per_flop: float
    b_us: float
    comm: CommModel
    micro_batch_fixed_us: float  # per micro-batch (FSDP gathers + reduce-scatters), not per layer
    step_fixed_us: float  # once per step (free-running: the first gathers and the one reduction)
    token_us: float  # per token of the rank holding the most, outside the layers (embedding, head, loss)
    attention_weight: float  # the attention term's weight in flops() (fitted by the profiler; 1: as published)
    whole_buffer: bool  # attention over a rank's buffer whole (CPU dense): each part priced as one sequence
    host_floor_us: float  # host floor of one layer call, once per call: layer_us (0: the line alone)
    def __init__(self, shape: ModelShape, a_us_per_flop: float, b_us: float, comm: CommModel,
                 micro_batch_fixed_us: float = 0.0, step_fixed_us: float = 0.0, token_us: float = 0.0,
                 attention_weight: float = 1.0, whole_buffer: bool = False, host_floor_us: float = 0.0) -> None: ...
    def flops(self, length: int) -> float: ...
    def kv_bytes(self, length: int) -> float: ...
    def line_us(self, flops: float) -> float: ...  # one part of a layer on the device: a F + b (0 when F == 0)
    def layer_us(self, comm_us: float, local_flops: float, dist_flops: float) -> float: ...
    # one rank's layer call: max(host_floor_us, max(comm_us, line(local)) + line(dist))
    def comp_us(self, flops: float) -> float: ...  # a layer call of one part: layer_us(0, flops, 0)
    def floored_us(self, calls: float) -> float: ...  # calls x (layers x host_floor_us + micro_batch_fixed_us)
    def pad_pass_us(self) -> float: ...  # a pad pass: layers x comp_us(flops(1)) + micro_batch_fixed_us + head
    def chunk_pass_us(self, prefix: int, tokens: int, cp: int, recomputed: bool,
                      dense: bool = False) -> float: ...  # one chunk pass of a chunked document
    def pad_chunks_us(self, start: int, count: int, cp: int) -> float: ...  # lockstep pad chunks from `start`
    def collective_us(self, bytes: float) -> float: ...
    def comm_us(self, bytes: float) -> float: ...
    def local_flops(self, tokens: int, per_doc: float) -> float: ...
    def dist_flops(self, tokens: int, per_doc_share: float, cp: int) -> float: ...
    def micro_batch_us(self, local_flops: Sequence[float], dist_flops: float, comm_bytes: float,
                       most_tokens: int = 0) -> float: ...
    def micro_batch_lower_bound_us(self, lengths: Sequence[int], cp: int) -> float: ...
    def comm_is_monotone(self) -> bool: ...
    def planning_model(self) -> CostModel: ...

class Options:
    dp: int
    cp: int
    bucket_size: int
    placement: Placement
    rollback: Rollback
    micro_batch_count: MicroBatchCount
    dacp_search: DacpSearch
    max_extra_micro_batches: int
    refine: bool
    overlength: Overlength
    def __init__(self) -> None: ...

class DacpResult:
    status: Status
    cp_rank: list[int]
    rank_tokens: list[int]
    rank_flops: list[float]
    comm_bytes: float
    time_us: float
    rollbacks: int
    moves: int

class MicroBatch:
    dp_rank: int
    index: int
    seqs: list[int]
    dacp: DacpResult

class Schedule:
    lengths: list[int]
    dp_rank: list[int]
    micro_batch: list[int]
    cp_rank: list[int]
    micro_batches: list[MicroBatch]
    dp_offsets: list[int]
    dp_time_us: list[float]
    makespan_us: float
    dropped: list[int]
    truncated: list[int]
    chunked_us: list[float]
    chunked_dp_rank: list[int]
    chunked_chunks: list[int]
    chunked_lengths: list[int]
    chunked_last_chunk: list[int]
    chunked_pad_us: list[float]
    rollbacks: int
    moves: int
    elapsed_us: float

class PlanMicroBatch:
    slot: int
    first_group: int
    groups: int
    seqs: list[int]
    first_rank: list[int]
    num_ranks: list[int]
    rank_tokens: list[int]
    rank_flops: list[float]
    comm_bytes: float
    start_us: float
    time_us: float
    rollbacks: int
    moves: int

class Plan:
    lengths: list[int]
    micro_batch: list[int]
    first_rank: list[int]
    num_ranks: list[int]
    micro_batches: list[PlanMicroBatch]
    slots: int
    group_time_us: list[float]
    makespan_us: float
    dropped: list[int]
    truncated: list[int]
    chunked_us: list[float]
    chunked_group: list[int]
    chunked_chunks: list[int]
    chunked_pad_us: list[float]
    widened: int
    narrowed: int
    skrull_plan: bool
    rollbacks: int
    moves: int
    elapsed_us: float

def schedule(lengths: Sequence[int], cost_model: CostModel, options: Options,
             chunked_us: Sequence[float] = ..., chunked_chunks: Sequence[int] = ...,
             chunked_lengths: Sequence[int] = ..., chunked_last_chunk: Sequence[int] = ...) -> Schedule: ...
def assign_chunked(chunked_us: Sequence[float], dp: int) -> list[int]: ...
def lockstep_passes(chunked_chunks: Sequence[int], groups: Sequence[int], dp: int) -> list[int]: ...
def lockstep_pads(chunked_chunks: Sequence[int], groups: Sequence[int], dp: int) -> list[int]: ...
def lockstep_pad_us(chunked_lengths: Sequence[int], chunked_chunks: Sequence[int], chunked_last_chunk: Sequence[int],
                    groups: Sequence[int], dp: int, cp: int, cost_model: CostModel) -> list[float]: ...
def chunked_after(chunked_us: Sequence[float], groups: Sequence[int], dp: int, timeline: Timeline,
                  pad_us: Sequence[float]) -> list[float]: ...
def schedule_pool(lengths: Sequence[int], cost_model: CostModel, options: Options) -> Plan: ...

class Lookahead:
    """A window's regrouping (cpp/include/skrull/lookahead.hpp); samples numbered flat in arrival order."""

    offsets: list[int]
    step: list[int]
    steps: list[list[int]]
    step_us: list[float]
    arrival_us: list[float]
    window_us: float
    arrival_window_us: float
    moved: int
    max_delay: int
    long_fraction: float
    long_steps: int
    candidates: int
    screened: int
    swaps: int
    swap_trials: int
    swap_visits: int
    planned: int
    elapsed_us: float

def lookahead(batches: Sequence[Sequence[int]], cost_model: CostModel, options: Options,
              pool: bool = False, chunked: Sequence[Sequence[float]] = ...,
              chunked_chunks: Sequence[Sequence[int]] = ...,
              chunked_lengths: Sequence[Sequence[int]] = ...,
              chunked_last_chunk: Sequence[Sequence[int]] = ...) -> Lookahead: ...
@overload
def to_plan(schedule: Schedule, cp: int, timeline: Timeline, pad_us: float, step_us: float = ...) -> Plan: ...
@overload
def to_plan(schedule: Schedule, cost_model: CostModel, options: Options) -> Plan: ...
def dacp(lengths: Sequence[int], cost_model: CostModel, cp: int, bucket_size: int,
         placement: Placement = ..., rollback: Rollback = ..., refine: bool = False) -> DacpResult: ...
def dacp_sweep(lengths: Sequence[int], cost_model: CostModel, cp: int, bucket_size: int) -> DacpResult: ...
def dacp_for(lengths: Sequence[int], cost_model: CostModel, options: Options) -> DacpResult: ...
def evaluate_placement(lengths: Sequence[int], cp_rank: Sequence[int], cost_model: CostModel, cp: int,
                       bucket_size: int) -> DacpResult: ...
def shard_tokens(length: int, cp: int) -> int: ...
def max_sequence_length(bucket_size: int, ranks: int) -> int: ...

class Timeline(Enum):
    LOCKSTEP = 0
    FREE_RUNNING = 1

class SlotTime:
    def __init__(self, slot: int, first_group: int, groups: int, time_us: float) -> None: ...

def step_time_us(rank_us: Sequence[Sequence[float]], timeline: Timeline, pad_us: float, step_us: float = ...,
                 after_us: Sequence[float] = ...) -> float: ...
def plan_step_time_us(micro_batches: Sequence[SlotTime], dp: int, timeline: Timeline, pad_us: float,
                      step_us: float = ..., after_us: Sequence[float] = ...) -> float: ...
def plan_timeline(micro_batches: Sequence[SlotTime], dp: int, timeline: Timeline, pad_us: float,
                  step_us: float = ..., after_us: Sequence[float] = ...) -> tuple[float, list[float], list[float]]: ...
