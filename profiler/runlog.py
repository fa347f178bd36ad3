"""Run logs: iteration, event and request tables as Parquet, plus run.json, in one run directory.

Rows are buffered column by column and flushed in row groups, so a 100,000-request simulated run
streams to disk instead of piling up in memory. Files are written under temporary names and renamed
when the run closes, so a crashed run never leaves a table that looks complete.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ITERATIONS = pa.schema([
    ("iteration", pa.int64()),
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("dur_ns", pa.int64()),
    ("schedule_ns", pa.int64()),
    ("prepare_ns", pa.int64()),
    ("forward_ns", pa.int64()),
    ("sample_ns", pa.int64()),
    ("detokenize_ns", pa.int64()),
    ("postprocess_ns", pa.int64()),
    ("member_ids", pa.list_(pa.int64())),  # every request holding a slot, finished static members included
    ("scheduled_ids", pa.list_(pa.int64())),  # the requests that ran tokens this iteration
    ("finished_member_ids", pa.list_(pa.int64())),
    ("num_seqs", pa.int64()),
    ("prefill_tokens", pa.int64()),
    ("decode_tokens", pa.int64()),
    ("slots_finished", pa.int64()),  # held by finished requests (static batching)
    ("slots_stalled", pa.int64()),  # held by live members that ran nothing this iteration
    ("slots_empty", pa.int64()),
    ("token_budget", pa.int64()),
    ("seq_budget", pa.int64()),
    ("policy", pa.string()),
    ("limit", pa.string()),  # what stopped the scheduler adding work: the policy's reason
    ("admitted", pa.int64()),
    ("resumed", pa.int64()),
    ("preempted", pa.int64()),
    ("rejected", pa.int64()),
    ("kv_allocated", pa.int64()),
    ("kv_freed", pa.int64()),
    ("kv_in_use", pa.int64()),
    ("num_waiting", pa.int64()),  # queued, never run
    ("num_preempted", pa.int64()),  # preempted, waiting to resume
    ("simulated", pa.bool_()),
])

EVENTS = pa.schema([
    ("request_id", pa.int64()),
    ("iteration", pa.int64()),
    ("ts_ns", pa.int64()),
    ("kind", pa.string()),
    ("reason", pa.string()),
    ("tokens", pa.int64()),
])

REQUESTS = pa.schema([
    ("request_id", pa.int64()),
    ("arrival_ns", pa.int64()),
    ("prompt_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("max_tokens", pa.int64()),
    ("priority", pa.int64()),
    ("tenant", pa.string()),
    ("deadline_ns", pa.int64()),
    ("final_state", pa.string()),
    ("stop_reason", pa.string()),
    ("first_scheduled_iteration", pa.int64()),
    ("num_preemptions", pa.int64()),
    ("first_token_ns", pa.int64()),
    ("finish_ns", pa.int64()),
    ("text", pa.string()),
    ("simulated", pa.bool_()),
])

TABLES = {"iterations": ITERATIONS, "events": EVENTS, "requests": REQUESTS}


@dataclass
class _Table:
    """Rows buffered as tuples in schema order, written a row group at a time."""

    path: Path
    schema: pa.Schema
    rows_per_group: int
    writer: pq.ParquetWriter | None = None
    rows: int = 0  # written or buffered
    buffer: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tmp = self.path.with_name(self.path.name + ".partial")

    def append(self, row: tuple) -> None:
        self.buffer.append(row)
        self.rows += 1
        if len(self.buffer) >= self.rows_per_group:
            self.flush()

    def flush(self) -> None:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd")
        columns = list(zip(*self.buffer)) or [[] for _ in self.schema.names]
        self.writer.write_table(pa.table(dict(zip(self.schema.names, columns)), schema=self.schema))
        self.buffer = []

    def close(self) -> None:
        if self.buffer or self.writer is None:  # an empty table still gets its file and schema
            self.flush()
        self.writer.close()
        os.replace(self.tmp, self.path)


class RunLog:
    """Writes one run directory: iterations.parquet, events.parquet, requests.parquet, run.json."""

    def __init__(self, run_dir: Path, rows_per_group: int = 200_000) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._tables = {name: _Table(self.run_dir / f"{name}.parquet", schema, rows_per_group)
                        for name, schema in TABLES.items()}

    def iteration(self, row: dict) -> None:
        self._tables["iterations"].append(tuple(row[name] for name in ITERATIONS.names))

    def event(self, request_id: int, iteration: int, ts_ns: int, kind: str, reason: str | None, tokens: int) -> None:
        """One event row (positional: this is the hottest write, once per token)."""
        self._tables["events"].append((request_id, iteration, ts_ns, kind, reason, tokens))

    def request(self, row: dict) -> None:
        self._tables["requests"].append(tuple(row[name] for name in REQUESTS.names))

    def close(self, meta: dict) -> None:
        """Finish every table and write run.json last: its presence marks a complete run directory."""
        for table in self._tables.values():
            table.close()
        meta = dict(meta, tables={name: t.rows for name, t in self._tables.items()})
        tmp = self.run_dir / "run.json.partial"
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.run_dir / "run.json")
