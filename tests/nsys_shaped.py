"""Synthetic Nsight Systems exports for tests: nsys-shaped tables written as a parquetdir folder.

`Capture` collects processes, threads, NVTX ranges, CUDA API calls and the GPU work they launch,
with the columns and codes nsys writes: NVTX_EVENTS rows of eventType 59 (push/pop), 60
(start/end) and 75 (a domain's creation, its name in `text`); global thread ids packed as
<hw:8><vm:8><pid:24><tid:24>; runtime rows joined to kernels and memcpys by correlationId within a
process; names of kernels, API functions and threads in StringIds. `write(folder)` writes one
TABLE.parquet per table, as `nsys export --type parquetdir` does, so that `itertrace ingest` reads
it like any real export. The capture also keeps what it was given (`ranges`, `calls`, `gpu_work`),
for tests that compute the expected answer on their own.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PUSH_POP, START_END, DOMAIN_CREATE = 59, 60, 75
HW = 1  # the hardware id in every global id


class GpuKind(enum.Enum):
    """What a GPU operation is, as gpu_ops.kind names it."""

    KERNEL = "kernel"
    MEMCPY = "memcpy"


def global_tid(pid: int, tid: int) -> int:
    """nsys's global thread id of thread `tid` in process `pid`."""
    return (HW << 56) | (pid << 24) | tid


def global_pid(pid: int) -> int:
    """nsys's global process id (the global thread id with the tid bits cleared)."""
    return (HW << 56) | (pid << 24)


@dataclass(frozen=True)
class Range:
    """An NVTX range as the program opened it."""

    tid: int  # global thread id
    text: str
    start_ns: int
    end_ns: int
    domain: str | None
    push_pop: bool


@dataclass(frozen=True)
class Call:
    """A CUDA API call: its thread, function, times and correlation id."""

    tid: int
    name: str
    start_ns: int
    end_ns: int
    correlation_id: int


@dataclass(frozen=True)
class GpuWork:
    """A kernel or memcpy on a device and stream, launched by the call with its correlation id."""

    pid: int  # global process id
    kind: GpuKind
    name: str
    device: int
    stream: int
    start_ns: int
    end_ns: int
    correlation_id: int


@dataclass
class Capture:
    """The rows of one synthetic capture; `write` turns them into nsys's tables."""

    ranges: list[Range] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    gpu_work: list[GpuWork] = field(default_factory=list)
    threads: dict[int, str] = field(default_factory=dict)  # global tid -> name
    processes: dict[int, str] = field(default_factory=dict)  # global pid -> name

    def thread(self, pid: int, tid: int, name: str = "python") -> int:
        """Register thread `tid` of process `pid` (named `name`) and return its global id."""
        self.processes.setdefault(global_pid(pid), f"process {pid}")
        gtid = global_tid(pid, tid)
        self.threads[gtid] = name
        return gtid

    def range(self, tid: int, text: str, start_ns: int, end_ns: int, *, domain: str | None = None,
              push_pop: bool = True) -> None:
        """An NVTX range on thread `tid` (a global id), push/pop unless `push_pop` is False (start/end)."""
        self.ranges.append(Range(tid, text, start_ns, end_ns, domain, push_pop))

    def call(self, tid: int, name: str, start_ns: int, end_ns: int) -> int:
        """A CUDA API call that launches nothing (a synchronize, a malloc); returns its correlation id."""
        correlation = len(self.calls) + 1
        self.calls.append(Call(tid, name, start_ns, end_ns, correlation))
        return correlation

    def launch(self, tid: int, start_ns: int, end_ns: int, gpu_start_ns: int, gpu_end_ns: int, *, device: int = 0,
               stream: int = 7, name: str = "kernel", kind: GpuKind = GpuKind.KERNEL, api: str | None = None) -> int:
        """A call on thread `tid` that launches one GPU operation; returns its correlation id."""
        api = api or ("cudaLaunchKernel_v7000" if kind is GpuKind.KERNEL else "cudaMemcpyAsync_v3020")
        correlation = self.call(tid, api, start_ns, end_ns)
        self.gpu_work.append(GpuWork(tid & ~0xFFFFFF, kind, name, device, stream, gpu_start_ns, gpu_end_ns,
                                     correlation))
        return correlation

    def write(self, folder: Path) -> Path:
        """Write the capture into `folder` as TABLE.parquet files and return the folder."""
        folder.mkdir(parents=True, exist_ok=True)
        strings: dict[str, int] = {}

        def string_id(value: str) -> int:
            return strings.setdefault(value, len(strings) + 1)

        domains: dict[tuple[int, str], int] = {}  # (global pid, name) -> domain id in that process
        nvtx: list[dict] = []
        for r in sorted(self.ranges, key=lambda r: (r.start_ns, r.tid)):
            domain_id = 0
            if r.domain is not None:
                key = (r.tid & ~0xFFFFFF, r.domain)
                if key not in domains:
                    domains[key] = len([d for d in domains if d[0] == key[0]]) + 1
                    nvtx.append({"start": 0, "eventType": DOMAIN_CREATE, "text": r.domain, "globalTid": r.tid,
                                 "domainId": domains[key]})
                domain_id = domains[key]
            nvtx.append({"start": r.start_ns, "end": r.end_ns, "eventType": PUSH_POP if r.push_pop else START_END,
                         "text": r.text, "globalTid": r.tid, "domainId": domain_id})
        kernels = [w for w in self.gpu_work if w.kind is GpuKind.KERNEL]
        copies = [w for w in self.gpu_work if w.kind is GpuKind.MEMCPY]
        tables = {
            "NVTX_EVENTS": _table(nvtx, {"start": pa.int64(), "end": pa.int64(), "eventType": pa.int64(),
                                         "text": pa.string(), "globalTid": pa.int64(), "domainId": pa.int64(),
                                         "category": pa.int64(), "textId": pa.int64(), "int64Value": pa.int64()}),
            "CUPTI_ACTIVITY_KIND_RUNTIME": _table(
                [{"start": c.start_ns, "end": c.end_ns, "eventClass": 0, "globalTid": c.tid,
                  "correlationId": c.correlation_id, "nameId": string_id(c.name), "returnValue": 0}
                 for c in self.calls],
                {k: pa.int64() for k in ("start", "end", "eventClass", "globalTid", "correlationId", "nameId",
                                         "returnValue")}),
            "CUPTI_ACTIVITY_KIND_KERNEL": _table(
                [{"start": w.start_ns, "end": w.end_ns, "deviceId": w.device, "contextId": 1, "streamId": w.stream,
                  "correlationId": w.correlation_id, "globalPid": w.pid, "demangledName": string_id(w.name),
                  "shortName": string_id(w.name), "launchType": 0} for w in kernels],
                {k: pa.int64() for k in ("start", "end", "deviceId", "contextId", "streamId", "correlationId",
                                         "globalPid", "demangledName", "shortName", "launchType")}),
            "CUPTI_ACTIVITY_KIND_MEMCPY": _table(
                [{"start": w.start_ns, "end": w.end_ns, "deviceId": w.device, "contextId": 1, "streamId": w.stream,
                  "correlationId": w.correlation_id, "globalPid": w.pid, "bytes": 4096, "copyKind": 1}
                 for w in copies],
                {k: pa.int64() for k in ("start", "end", "deviceId", "contextId", "streamId", "correlationId",
                                         "globalPid", "bytes", "copyKind")}),
            "ThreadNames": _table([{"nameId": string_id(name), "priority": 10, "globalTid": tid}
                                   for tid, name in self.threads.items()],
                                  {"nameId": pa.int64(), "priority": pa.int64(), "globalTid": pa.int64()}),
            "PROCESSES": _table([{"globalPid": pid, "pid": (pid >> 24) & 0xFFFFFF, "name": name}
                                 for pid, name in self.processes.items()],
                                {"globalPid": pa.int64(), "pid": pa.int64(), "name": pa.string()}),
            "META_DATA_EXPORT": _table([{"name": "EXPORT_SCHEMA_VERSION", "value": "3.25.0"},
                                        {"name": "EXPORT_PRODUCT_VERSION", "value": "2026.2.1"}],
                                       {"name": pa.string(), "value": pa.string()}),
            "TARGET_INFO_SESSION_START_TIME": _table(
                [{"utcEpochNs": 1_780_000_000_000_000_000, "utcTime": "2026-05-28T20:26:40", "localTime": "x"}],
                {"utcEpochNs": pa.int64(), "utcTime": pa.string(), "localTime": pa.string()}),
            "ENUM_NSYS_EVENT_CLASS": _table([{"id": 0, "name": "TRACE_PROCESS_EVENT_CUDA_RUNTIME",
                                              "label": "CUDA runtime"}],
                                            {"id": pa.int64(), "name": pa.string(), "label": pa.string()}),
            "ENUM_CUDA_MEMCPY_OPER": _table([{"id": 1, "name": "CUDA_MEMCPY_KIND_HTOD", "label": "Host-to-Device"}],
                                            {"id": pa.int64(), "name": pa.string(), "label": pa.string()}),
        }
        tables["StringIds"] = _table([{"id": i, "value": v} for v, i in strings.items()],
                                     {"id": pa.int64(), "value": pa.string()})
        for name, table in tables.items():
            if table.num_rows:  # nsys writes only the tables that have rows
                pq.write_table(table, folder / f"{name}.parquet")
        return folder


def _table(rows: list[dict], schema: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({name: pa.array([row.get(name) for row in rows], kind) for name, kind in schema.items()})
