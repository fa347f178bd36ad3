"""The engine's run directory as the database holds it: table and column documentation, expected types.

A run directory (written by `itertrace run`, see profiler/tracing/runlog.py) holds `iterations.parquet`,
`events.parquet`, `requests.parquet` and `run.json`. Each Parquet file becomes a table named `run_` plus
its stem, with the file's columns unchanged; `run.json` becomes the one-row table `run_meta`. Every
column named here must be present with a value of its kind, but for the optional ones an older engine
did not write, which the table holds as NULL; columns a newer engine adds pass through with a comment
saying this itertrace does not describe them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

RUN_FORMAT = "itertrace-run/1"  # run.json's "format" that this version reads
RUN_JSON = "run.json"


class Kind(enum.Enum):
    """What a column holds, whatever integer width or string encoding the file uses."""

    INT = "an integer"
    TEXT = "text"
    BOOL = "a boolean"
    INT_LIST = "a list of integers"

    @property
    def sql_type(self) -> str:
        """The DuckDB type a column of this kind gets where the log lacks it."""
        return {Kind.INT: "BIGINT", Kind.TEXT: "VARCHAR", Kind.BOOL: "BOOLEAN", Kind.INT_LIST: "BIGINT[]"}[self]

    def matches(self, kind: pa.DataType) -> bool:
        import pyarrow as pa  # here, not above: a Kineto ingest never imports it

        if pa.types.is_dictionary(kind):
            return self.matches(kind.value_type)
        if self is Kind.INT:
            return pa.types.is_integer(kind)
        if self is Kind.TEXT:
            return pa.types.is_string(kind) or pa.types.is_large_string(kind)
        if self is Kind.BOOL:
            return pa.types.is_boolean(kind)
        return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)


@dataclass(frozen=True)
class RunTable:
    """One Parquet file of a run directory and the table it becomes."""

    stem: str  # file name without .parquet
    table: str  # table name in the database
    doc: str
    columns: dict[str, tuple[Kind, str]]
    optional: frozenset[str] = frozenset()  # columns an older engine did not write: NULL in its tables

    @property
    def file_name(self) -> str:
        return f"{self.stem}.parquet"


_I, _T, _B, _L = Kind.INT, Kind.TEXT, Kind.BOOL, Kind.INT_LIST
_PHASE = "ns the engine spent in its {} phase this iteration, by the run's clock (the NVTX range of the same name)"

ITERATIONS = RunTable("iterations", "run_iterations", (
    "The engine's iteration log (iterations.parquet): one row per iteration that ran work. Times are ns on the "
    "run's clock (run_meta.clock_source), not on the capture's; join to nvtx_ranges through the step range's "
    "payload (nvtx_ranges.int64_value = iteration), never through times."), {
    "iteration": (_I, "Iteration number, from 0; the int64 payload of this iteration's NVTX step range."),
    "start_ns": (_I, "When the iteration started, in ns on the run's clock."),
    "end_ns": (_I, "When the iteration ended (its tokens exist from here), in ns on the run's clock."),
    "dur_ns": (_I, "end_ns - start_ns."),
    "schedule_ns": (_I, _PHASE.format("schedule")),
    "prepare_ns": (_I, _PHASE.format("prepare")),
    "forward_ns": (_I, _PHASE.format("forward")),
    "sample_ns": (_I, _PHASE.format("sample")),
    "detokenize_ns": (_I, _PHASE.format("detokenize")),
    "postprocess_ns": (_I, _PHASE.format("postprocess")),
    "member_ids": (_L, "Request ids holding a slot this iteration, finished static-batch members included."),
    "scheduled_ids": (_L, "Request ids that ran tokens this iteration."),
    "finished_member_ids": (_L, "Request ids that hold a slot although finished (static batching)."),
    "num_seqs": (_I, "Sequences that ran tokens this iteration."),
    "prefill_tokens": (_I, "Prompt (or recomputed) tokens run this iteration."),
    "decode_tokens": (_I, "Decode tokens run this iteration (one per decoding sequence)."),
    "slots_finished": (_I, "Slots held by finished requests (static batching)."),
    "slots_stalled": (_I, "Slots held by live members that ran nothing this iteration."),
    "slots_empty": (_I, "Slots no request held: capacity minus members."),
    "token_budget": (_I, "Tokens the scheduler may run per iteration."),
    "seq_budget": (_I, "Sequences the scheduler may run per iteration: the batch capacity in slots."),
    "policy": (_T, "Scheduling policy: fcfs, srw, edf or priority."),
    "limit": (_T, "What stopped the scheduler adding work: queue_empty, seq_budget, token_budget, decode_reserve, "
                  "kv_blocks or static_batch."),
    "admitted": (_I, "Requests admitted from the queue this iteration."),
    "resumed": (_I, "Preempted requests resumed this iteration."),
    "preempted": (_I, "Requests preempted this iteration."),
    "rejected": (_I, "Requests rejected this iteration."),
    "kv_allocated": (_I, "KV blocks allocated this iteration."),
    "kv_freed": (_I, "KV blocks freed this iteration."),
    "kv_in_use": (_I, "KV blocks in use after scheduling."),
    "num_waiting": (_I, "Requests queued that never ran, after scheduling."),
    "num_preempted": (_I, "Preempted requests waiting to resume, after scheduling."),
    "simulated": (_B, "True when the simulated runner (a cost model on a virtual clock) made this row."),
    "device_start_ns": (_I, "When the iteration's forward pass started, on the run's clock (in overlap mode on the "
                            "thread that ran it); NULL for an iteration with no forward pass."),
    "device_end_ns": (_I, "When its forward pass ended, on the run's clock; NULL for an iteration with no forward pass."),
    "dropped_tokens": (_I, "Overlap mode: tokens this iteration computed for requests that had ended (a stop token "
                           "in the iteration before, or a cancel), dropped: never emitted nor counted; 0 otherwise."),
}, optional=frozenset({"device_start_ns", "device_end_ns", "dropped_tokens"}))

EVENTS = RunTable("events", "run_events", (
    "The engine's request events (events.parquet): one row per transition of a request. ts_ns is on the run's "
    "clock; token, first_token and finish events carry the end of the iteration that made them."), {
    "request_id": (_I, "The request (run_requests.request_id; the payload of its arrive and finish NVTX marks)."),
    "iteration": (_I, "Iteration in which the event happened (run_iterations.iteration)."),
    "ts_ns": (_I, "When, in ns on the run's clock. For arrive, when the engine took the request in (at or after "
                  "run_requests.arrival_ns, at an iteration boundary)."),
    "kind": (_T, "arrive, admit, prefill_chunk, first_token, token, preempt, resume, finish, cancel or reject."),
    "reason": (_T, "Why the transition happened (e.g. max_tokens, kv_exhausted); NULL where there is no reason."),
    "tokens": (_I, "Tokens the event concerns (e.g. prompt tokens of a prefill chunk); NULL where none."),
})

REQUESTS = RunTable("requests", "run_requests", (
    "The engine's requests (requests.parquet): one row per request of the workload, in its final state."), {
    "request_id": (_I, "Request id, unique within the run; the payload of its arrive and finish NVTX marks."),
    "arrival_ns": (_I, "Arrival, in ns on the run's clock."),
    "prompt_tokens": (_I, "Prompt length in tokens."),
    "output_tokens": (_I, "Tokens generated."),
    "max_tokens": (_I, "Most tokens the request may generate."),
    "priority": (_I, "Priority class (priority policy)."),
    "tenant": (_T, "Tenant name."),
    "deadline_ns": (_I, "Deadline on the run's clock (edf policy); NULL when none."),
    "final_state": (_T, "finished_stop, finished_length, canceled or rejected (a live state if the run ended "
                        "early)."),
    "stop_reason": (_T, "Why the request stopped (e.g. max_tokens, stop_token); NULL if it did not."),
    "first_scheduled_iteration": (_I, "Iteration that first ran it; NULL if never."),
    "num_preemptions": (_I, "Times it was preempted."),
    "first_token_ns": (_I, "End of the iteration that sampled its first token, on the run's clock; NULL if none."),
    "finish_ns": (_I, "When it reached a terminal state, on the run's clock; NULL if it did not."),
    "text": (_T, "Detokenized output text."),
    "simulated": (_B, "True when the simulated runner made this row."),
})

RUN_TABLES = (ITERATIONS, EVENTS, REQUESTS)

# run.json keys that must be present, with the JSON type of each.
REQUIRED_META: dict[str, type] = {
    "format": str, "runner": str, "simulated": bool, "device": str, "workload": str, "seed": int,
    "clock_source": str, "clock_epoch_unix_ns": int, "config": dict, "versions": dict,
}

META_DOC = ("The run (run.json): one row describing the engine run whose logs are the run_* tables: runner, "
            "device, workload, seed, clock, configuration and package versions.")
# (column, DuckDB type, comment), in table order.
META_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run_id", "VARCHAR", "Id of the run: the first 16 hex digits of the SHA-256 of its run.json, the same for "
                          "every database made from this run."),
    ("run_name", "VARCHAR", "Name of the run directory."),
    ("source", "VARCHAR", "Absolute path of the run directory that was ingested."),
    ("format", "VARCHAR", "Run directory format (run.json's format), e.g. itertrace-run/1."),
    ("runner", "VARCHAR", "Runner that made the run: torch (a real forward pass) or simulated (a cost model)."),
    ("simulated", "BOOLEAN", "True when the run is simulated: its times come from a cost model, not a machine."),
    ("device", "VARCHAR", "Device of the forward pass (cpu, cuda, cuda:0; none for the simulated runner)."),
    ("workload", "VARCHAR", "Workload name or trace file the run read."),
    ("seed", "BIGINT", "Seed of the workload, model weights and sampling."),
    ("clock_source", "VARCHAR", "Clock of every *_ns column in the run_* tables: time.perf_counter_ns counted from "
                                "the run's start, or simulated."),
    ("clock_epoch_unix_ns", "BIGINT", "Unix time in ns at the run clock's zero, for people; joins use ids, not clocks "
                                      "(0 for simulated runs)."),
    ("mode", "VARCHAR", "Scheduling mode (config.scheduler.mode): static or continuous; NULL if absent."),
    ("policy", "VARCHAR", "Scheduling policy (config.scheduler.policy); NULL if absent."),
    ("capacity", "BIGINT", "Batch capacity in sequences (config.scheduler.max_num_seqs); NULL if absent."),
    ("python", "VARCHAR", "Python version of the run; NULL if not recorded."),
    ("platform", "VARCHAR", "Platform string of the machine (platform.platform()); NULL if not recorded."),
    ("iterations", "BIGINT", "Rows of iterations.parquet (run_iterations)."),
    ("events", "BIGINT", "Rows of events.parquet (run_events)."),
    ("requests", "BIGINT", "Rows of requests.parquet (run_requests)."),
    ("config_json", "VARCHAR", "The run's whole configuration (run.json's config) as JSON text with sorted keys."),
    ("versions_json", "VARCHAR", "Versions of itertrace, torch, numpy, pyarrow, duckdb and nvtx used (JSON text)."),
    ("summary_json", "VARCHAR", "The engine's own summary of the run (run.json's summary) as JSON text; NULL if none."),
)

EXTRA_COLUMN_DOC = "Column of {file} that this version of itertrace does not describe; kept as the file has it."
