"""Read the tables of Arrow and Parquet exports as streams of record batches, checking them first.

Three layouts: one `.arrow` file of concatenated IPC streams (one per table, the name in the schema
metadata key `table_name`, as `nsys export --type arrow` writes it), and folders of one file per table
(`TABLE.arrow` as IPC stream or file format, `TABLE.parquet`). Every table is checked when it is listed,
before anything is written, so a truncated or corrupt export fails with one line naming the file.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from itertrace.errors import UserError, not_a_file
from itertrace.ingest.checks import check_arrow_export, check_table, table_name

if TYPE_CHECKING:  # pyarrow is imported where a table is read: a Kineto ingest never imports it
    import pyarrow as pa

TABLE_SUFFIXES = (".arrow", ".parquet")
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # end-of-stream marker closing every IPC stream
_FILE_MAGIC = b"ARROW1"


@dataclass(frozen=True)
class TableStream:
    """One table of an export: where it lives, its schema and row count, and how to read it."""

    name: str
    file: Path
    schema: pa.Schema
    num_rows: int
    read: Callable[[int], Iterator[pa.RecordBatch]]  # batches of at most the given number of rows
    whole: Callable[[], pa.Table] | None = None  # the whole table without copying (memory-mapped IPC), if it can


def arrow_export_tables(path: Path) -> list[TableStream]:
    """The tables of one `.arrow` file of concatenated IPC streams."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    size = _nonempty_size(path)
    _check_stream_end(path, size)
    tables: list[TableStream] = []
    with pa.memory_map(str(path)) as source:
        while source.tell() < size:
            offset = source.tell()
            try:
                reader = ipc.open_stream(source)
                rows = sum(batch.num_rows for batch in reader)  # zero-copy: reads message headers only
            except (pa.ArrowInvalid, OSError) as exc:
                raise UserError(f"{path}: truncated or corrupt Arrow export at byte {offset} ({first_line(exc)})")
            name = table_name((reader.schema.metadata or {}).get(b"table_name"), path, offset)
            check_table(name, path, reader.schema, (table.name for table in tables))
            tables.append(TableStream(name, path, reader.schema, rows, _stream_reader(path, offset),
                                      _stream_table(path, offset)))
    check_arrow_export(path, [table.name for table in tables])
    return tables


def folder_tables(folder: Path) -> list[TableStream]:
    """The tables of an arrowdir or parquetdir folder: one `TABLE.arrow` or `TABLE.parquet` per table."""
    tables: dict[str, TableStream] = {}
    for file in table_files(folder):
        if why := not_a_file(file, "table file"):
            raise UserError(f"{file}: {why}")
        table = _parquet_table(file) if file.suffix == ".parquet" else _arrow_file_table(file)
        if table.name in tables:
            raise UserError(f"{folder}: table {table.name} appears twice ({tables[table.name].file.name}, {file.name})")
        check_table(table.name, file, table.schema, tables)
        tables[table.name] = table
    return list(tables.values())


def table_files(folder: Path) -> list[Path]:
    """The entries directly inside `folder` named as table files, sorted by name (a FIFO, a folder or a link to
    nothing among them is refused when the tables are read, never passed over)."""
    return sorted(p for p in folder.iterdir() if p.suffix in TABLE_SUFFIXES)


def _stream_reader(path: Path, offset: int) -> Callable[[int], Iterator[pa.RecordBatch]]:
    def read(batch_rows: int) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        with pa.memory_map(str(path)) as source:
            source.seek(offset)
            for batch in ipc.open_stream(source):
                yield from _slices(batch, batch_rows)

    return read


def _stream_table(path: Path, offset: int) -> Callable[[], pa.Table]:
    def whole() -> pa.Table:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        source = pa.memory_map(str(path))  # kept open by the table's buffers, which point into it
        source.seek(offset)
        return ipc.open_stream(source).read_all()

    return whole


def _arrow_file_table(file: Path) -> TableStream:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    size = _nonempty_size(file)
    with open(file, "rb") as raw:
        is_file_format = raw.read(len(_FILE_MAGIC)) == _FILE_MAGIC
    if not is_file_format:
        _check_stream_end(file, size)
    try:
        with pa.memory_map(str(file)) as source:
            if is_file_format:
                reader = ipc.open_file(source)
                schema = reader.schema
                rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            else:
                stream = ipc.open_stream(source)
                schema = stream.schema
                rows = sum(batch.num_rows for batch in stream)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"{file}: truncated or corrupt Arrow table file ({first_line(exc)})")
    read = _file_format_reader(file) if is_file_format else _stream_reader(file, 0)
    whole = _file_format_table(file) if is_file_format else _stream_table(file, 0)
    return TableStream(file.stem, file, schema, rows, read, whole)


def _file_format_reader(file: Path) -> Callable[[int], Iterator[pa.RecordBatch]]:
    def read(batch_rows: int) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        with pa.memory_map(str(file)) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield from _slices(reader.get_batch(i), batch_rows)

    return read


def _file_format_table(file: Path) -> Callable[[], pa.Table]:
    def whole() -> pa.Table:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        return ipc.open_file(pa.memory_map(str(file))).read_all()

    return whole


def parquet_table(file: Path) -> TableStream:
    """One Parquet file as a table named after the file's stem, after checking its footer can be read."""
    return _parquet_table(file)


def _parquet_table(file: Path) -> TableStream:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _nonempty_size(file)
    try:
        meta = pq.ParquetFile(file)
        schema, rows = meta.schema_arrow, meta.metadata.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{file}: truncated or corrupt Parquet file ({first_line(exc)})")

    def read(batch_rows: int) -> Iterator[pa.RecordBatch]:
        yield from pq.ParquetFile(file).iter_batches(batch_size=batch_rows)

    return TableStream(file.stem, file, schema, rows, read)


def _slices(batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def _check_stream_end(path: Path, size: int) -> None:
    with open(path, "rb") as raw:
        raw.seek(max(0, size - len(_EOS)))
        if raw.read() != _EOS:
            raise UserError(f"{path}: truncated Arrow data (the file does not end with an end-of-stream marker)")


def _nonempty_size(path: Path) -> int:
    size = path.stat().st_size
    if size == 0:
        raise UserError(f"{path}: empty file, not an export")
    return size


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
