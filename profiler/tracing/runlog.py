"""Run logs: iteration, event and request tables as Parquet, plus run.json, in one run directory.

Rows are buffered column by column and flushed in row groups, so a 100,000-request simulated run
streams to disk instead of piling up in memory. Files are written under temporary names and renamed
when the run closes, so a crashed run never leaves a table that looks complete.

Row groups are built into Arrow tables on the engine's thread and written (encoded, compressed) on
one writer thread, which does that without holding the GIL, so the writing overlaps the engine's
loop. (Building tables there too was slower: it needs the GIL, and the two threads took turns.)
"""
from __future__ import annotations

import json
import operator
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from itertrace.profiler.tracing.arrow_tables import Codes, coded, encodings, mixed_table, rows_table
from itertrace.profiler.scheduling.decision import EventKind

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
    ("device_start_ns", pa.int64()),  # the forward pass's start on the run's clock; NULL without one
    ("device_end_ns", pa.int64()),
    ("dropped_tokens", pa.int64()),  # overlap mode: tokens computed for requests that had ended, dropped
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
_ITERATION_ROW = operator.itemgetter(*ITERATIONS.names)  # dict -> tuple in schema order
_REQUEST_ROW = operator.itemgetter(*REQUESTS.names)


_MAX_PENDING = 2  # row groups handed to the writer thread and not yet written, at most
_FEW_ROWS = 16  # iteration rows that came as columns but go in as rows (see RunLog.iterations)
_ID_LISTS = {f.name for f in ITERATIONS if pa.types.is_list(f.type)}  # one id array every row of a part holds


@dataclass
class _Table:
    """Rows buffered as tuples in schema order, written a row group at a time on the writer thread."""

    path: Path
    schema: pa.Schema
    rows_per_group: int
    writer_thread: ThreadPoolExecutor
    labels: dict[str, str] = field(default_factory=dict)  # the file's key-value metadata (see RunLog)
    stores_schema = True  # the Arrow schema, its metadata with it, goes into the file (not a dataclass field)
    rows: int = 0  # written or buffered
    buffer: list[tuple] = field(default_factory=list)
    buffered: int = 0  # rows not yet written

    def __post_init__(self) -> None:
        self.tmp = self.path.with_name(self.path.name + ".partial")
        self.writer: pq.ParquetWriter | None = None  # written to on the writer thread only
        self._carry: pa.Table | None = None  # ordered rows short of a row group, from the last flush
        self._parts: list[list[tuple] | tuple[dict, int]] = []  # rows that came as columns, and the rows before them
        self._pending: list[Future] = []  # row groups handed to the writer thread, oldest first

    def append(self, row: tuple) -> None:
        self.buffer.append(row)
        self._added(1)

    def append_columns(self, columns: dict, n: int) -> None:
        """`n` rows at once: per column an array of n values, or one value for every row (for a list
        column, one id array every row holds). Integer columns then take no nulls. The arrays are kept
        as they are until written: the caller must not write them again."""
        if self.buffer:
            self._parts.append(self.buffer)
            self.buffer = []
        self._parts.append((columns, n))
        self._added(n)

    def _added(self, n: int) -> None:
        self.rows += n
        self.buffered += n
        if self.buffered >= self.rows_per_group:
            self.flush()

    def flush(self, final: bool = False) -> None:
        """Write whole row groups of `rows_per_group` rows (and, when final, the rest): the table is built
        here, and encoded and compressed on the writer thread. The first error it met is raised here."""
        self._drain(keep=_MAX_PENDING - 1)  # a writer behind: wait for it, rather than pile up tables
        if self.writer is None:
            self.writer = self._writer()
        table = self._take_buffer()
        if self._carry is not None:
            table = pa.concat_tables([self._carry, table])
        cut = table.num_rows if final else table.num_rows - table.num_rows % self.rows_per_group
        if cut or table.num_rows == 0:
            self._pending.append(self.writer_thread.submit(
                self.writer.write_table, table.slice(0, cut), row_group_size=self.rows_per_group))
        self._carry = table.slice(cut) if cut < table.num_rows else None
        self.buffered = table.num_rows - cut

    def _drain(self, keep: int) -> None:
        """Forget finished writes, raising the first one's error, and wait until at most `keep` remain."""
        while self._pending and (self._pending[0].done() or len(self._pending) > keep):
            self._pending.pop(0).result()

    def _writer(self) -> pq.ParquetWriter:
        return pq.ParquetWriter(self.tmp, self.schema.with_metadata(self.labels), compression="zstd",
                                **encodings(self.schema))

    def _take_buffer(self) -> pa.Table:
        """The buffered rows as a table, in the order they came; empties the buffer."""
        parts, rows = self._parts, self.buffer
        self._parts, self.buffer = [], []
        if parts:  # some rows came as columns
            return mixed_table([*parts, rows], self.schema)
        return rows_table(rows, self.schema)

    def close(self) -> None:
        """Write what is left; then the file takes its name."""
        if self.buffered or self.writer is None:  # an empty table still gets its file and schema
            self.flush(final=True)
        self._drain(keep=0)
        if not self.stores_schema:  # the schema's metadata went nowhere: the labels go in by hand
            self.writer.add_key_value_metadata(self.labels)
        self.writer.close()
        os.replace(self.tmp, self.path)


@dataclass
class _EventTable(_Table):
    """The event table: rows one at a time, and token events a block at a time, kept in the order they came.

    Strings are kept as codes and every column is built with numpy at flush time: a token-heavy run
    writes millions of rows.
    """

    blocks: list[tuple[int, np.ndarray, int, int, np.ndarray]] = field(default_factory=list)
    stores_schema = False  # see _writer

    def __post_init__(self) -> None:
        super().__post_init__()
        self._kinds = Codes(kind.value for kind in EventKind)
        self._reasons = Codes()

    def append_tokens(self, request_ids: np.ndarray, iteration: int | np.ndarray, ts_ns: int | np.ndarray,
                      first: np.ndarray) -> None:
        """Token rows, one per request id; `iteration` and `ts_ns` are one value for all, or one per row."""
        self.blocks.append((len(self.buffer), request_ids, iteration, ts_ns, first))
        self._added(len(request_ids))

    def _writer(self) -> pq.ParquetWriter:
        """Kinds and reasons go to the file as they are kept, dictionary-encoded, without turning millions
        of codes into strings first; with no Arrow schema stored, every reader sees plain string columns."""
        return pq.ParquetWriter(self.tmp, coded(self.schema).with_metadata(self.labels), compression="zstd",
                                store_schema=False, **encodings(self.schema))

    def _take_buffer(self) -> pa.Table:
        rows, blocks = self.buffer, self.blocks
        self.buffer, self.blocks = [], []
        ids, iterations, ts, kinds, reasons, tokens = zip(*rows) if rows else ((),) * 6
        ints = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
        columns = [ints(ids), ints(iterations), ints(ts), np.array([self._kinds[k] for k in kinds], dtype=np.int16),
                   np.array([self._reasons[r] for r in reasons], dtype=np.int16), ints(tokens)]
        if blocks:
            before, ids, iterations, ts, first = zip(*blocks)
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            first = np.concatenate(first)
            token, first_token = self._kinds[EventKind.TOKEN.value], self._kinds[EventKind.FIRST_TOKEN.value]
            starts = np.cumsum(lengths) - lengths
            per_row = [j for j, v in enumerate(iterations) if isinstance(v, np.ndarray)]  # blocks of several iterations

            def spread(values: tuple) -> np.ndarray:  # a value per block -> a value per row
                scalars = [0 if isinstance(v, np.ndarray) else v for v in values] if per_row else values
                column = np.repeat(ints(scalars), lengths)
                for j in per_row:
                    column[starts[j]: starts[j] + lengths[j]] = values[j]
                return column

            block_columns = [np.concatenate(ids), spread(iterations), spread(ts),
                             np.where(first, first_token, token).astype(np.int16),
                             np.full(len(first), -1, dtype=np.int16), np.ones(len(first), dtype=np.int64)]
            # row i goes before block j when i < before[j]: sort rows on 2i + 1 and blocks on 2 * before[j]
            keys = np.concatenate((2 * np.arange(len(rows)) + 1, 2 * np.repeat(ints(before), lengths)))
            order = np.argsort(keys, kind="stable")
            columns = [np.concatenate(pair)[order] for pair in zip(columns, block_columns)]
        ids, iterations, ts, kinds, reasons, tokens = columns
        return pa.table([ids, iterations, ts, self._kinds.column(kinds), self._reasons.column(reasons), tokens],
                        schema=coded(self.schema))


class RunLog:
    """Writes one run directory: iterations.parquet, events.parquet, requests.parquet, run.json."""

    def __init__(self, run_dir: Path, rows_per_group: int = 200_000, labels: dict | None = None) -> None:
        """`labels` (here: which runner, and whether it was simulated) go into every Parquet file's metadata
        as `itertrace.<key>` = JSON value, so that a table read on its own still says who made it."""
        self.run_dir = Path(run_dir)
        stamp = {f"itertrace.{key}": json.dumps(value) for key, value in (labels or {}).items()}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # one thread for all three tables: each table's row groups are written in the order they came
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="itertrace-runlog")
        self._tables = {name: (_EventTable if name == "events" else _Table)(
            self.run_dir / f"{name}.parquet", schema, rows_per_group, self._thread, stamp)
            for name, schema in TABLES.items()}

    def iteration(self, row: dict) -> None:
        self._tables["iterations"].append(_ITERATION_ROW(row))

    def event(self, request_id: int, iteration: int, ts_ns: int, kind: str, reason: str | None, tokens: int) -> None:
        """One event row."""
        self._tables["events"].append((request_id, iteration, ts_ns, kind, reason, tokens))

    def iterations(self, columns: dict, n: int) -> None:
        """`n` iteration rows at once, as columns (see _Table.append_columns). A few rows go in as rows: a
        part of its own costs more to turn into a table than they do."""
        table = self._tables["iterations"]
        if n > _FEW_ROWS:
            table.append_columns(columns, n)
            return
        arrays = {name: values.tolist() for name, values in columns.items()
                  if type(values) is np.ndarray and name not in _ID_LISTS}
        for i in range(n):
            table.append(_ITERATION_ROW(columns | {name: values[i] for name, values in arrays.items()}))

    def token_events(self, request_ids: np.ndarray, iteration: int, ts_ns: int, first: np.ndarray) -> None:
        """One `first_token` or `token` event row per request id (tokens=1, no reason), all at `ts_ns`."""
        self._tables["events"].append_tokens(request_ids, iteration, ts_ns, first)

    def token_steps(self, request_ids: np.ndarray, iterations: np.ndarray, ts_ns: np.ndarray,
                    chunk: tuple[int, int, np.ndarray] | None = None) -> None:
        """`token` rows (never a first token) of the same requests over several iterations: each request
        id in every one of `iterations`, at that iteration's `ts_ns`, in that order. `chunk`: (request id,
        tokens, [iterations] start ns) of a prompt chunk run in each iteration, whose `prefill_chunk` row, at
        the iteration's start, goes before the iteration's token rows in every iteration but the first."""
        n, table = len(request_ids), self._tables["events"]
        if chunk is None:
            table.append_tokens(np.tile(request_ids, len(iterations)), np.repeat(iterations, n),
                                np.repeat(ts_ns, n), np.zeros(n * len(iterations), dtype=bool))
            return
        request_id, tokens, starts_ns = chunk
        kind, no_first = EventKind.PREFILL_CHUNK.value, np.zeros(n, dtype=bool)
        for k, (iteration, start, end) in enumerate(zip(iterations.tolist(), starts_ns.tolist(), ts_ns.tolist())):
            if k:
                table.append((request_id, iteration, start, kind, None, tokens))
            table.append_tokens(request_ids, iteration, end, no_first)

    def request(self, row: dict) -> None:
        self._tables["requests"].append(_REQUEST_ROW(row))

    def abort(self) -> None:
        """The run failed: drop the row groups not yet written and stop the writer thread. The tables stay
        under their temporary names and no run.json is written, so the directory never looks complete."""
        self._thread.shutdown(wait=True, cancel_futures=True)

    def close(self, meta: dict) -> None:
        """Finish every table and write run.json last: its presence marks a complete run directory."""
        for table in self._tables.values():
            table.close()
        self._thread.shutdown()
        meta = dict(meta, tables={name: t.rows for name, t in self._tables.items()})
        tmp = self.run_dir / "run.json.partial"
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.run_dir / "run.json")
