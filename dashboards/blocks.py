"""What a report is made of: sections of charts, tables and notes, and the runs they come from."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import altair as alt
import pyarrow as pa

from itertrace.queries.api import QueryDB


@dataclass(frozen=True)
class ChartBlock:
    """A chart with a short caption saying what it shows."""

    name: str  # file-name-safe, for --png
    chart: alt.TopLevelMixin
    caption: str
    heading: str = ""  # the run's label, for a chart of one run among several


@dataclass(frozen=True)
class TableBlock:
    """A table of query rows; ns columns are shown in ms and shares in percent (html.format_cell)."""

    title: str
    table: pa.Table
    caption: str = ""
    hover: dict[str, str] = field(default_factory=dict)  # shown column -> column of its full text, shown on hover


@dataclass(frozen=True)
class NoteBlock:
    """A sentence in place of what a database cannot show."""

    text: str


Block = ChartBlock | TableBlock | NoteBlock


@dataclass
class Section:
    id: str
    title: str
    intro: str
    blocks: list[Block] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    title: str
    meta: pa.Table  # one row per run
    simulated: tuple[str, ...]  # labels of simulated runs
    sections: tuple[Section, ...]
    mappings: tuple[str, ...] = ()  # one line per capture: the steps its mapping found and how it was chosen
    meta_title: str = "Runs"  # the heading of `meta`

    def charts(self) -> list[ChartBlock]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, ChartBlock)]

    def tables(self) -> list[TableBlock]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, TableBlock)]


@dataclass
class RunData:
    label: str
    path: Path
    db: QueryDB
    meta: dict | None  # run_meta's row; None without a run log
    capture: dict | None  # capture_meta's row; None without a trace
    iterations_in_trace: int
    gpu_ops: int = 0  # GPU operations in its capture
    mapping_note: str | None = None  # the banner's line: which steps the mapping found, and how it was chosen
    start_ns: int = 0  # when its capture started, on the capture's clock (time_axis.capture_start_ns)

    @property
    def has_log(self) -> bool:
        return self.meta is not None

    @property
    def has_trace(self) -> bool:
        return self.iterations_in_trace > 0
