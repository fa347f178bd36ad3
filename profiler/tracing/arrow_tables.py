"""Arrow tables from a run log's buffered rows: rows that came one by one, blocks of columns, and small
integer codes for string columns; and the Parquet encodings the run log writes them with."""
from __future__ import annotations

import numpy as np
import pyarrow as pa


def rows_table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    """Rows that came one by one as a table."""
    columns = list(zip(*rows)) or [[] for _ in schema.names]
    return pa.table([list_column(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), values)
                     if pa.types.is_list(f.type) else values for values, f in zip(columns, schema)], schema=schema)


def encodings(schema: pa.Schema) -> dict:
    """Parquet encodings: integers (ids, iterations, clocks: mostly small steps) delta-packed, strings
    dictionary-encoded. Against the default (a dictionary for every column), a made-up row group of
    200,000 event rows (ids, iterations, clocks, kinds) wrote in 26 ms instead of 43 and took 52 KB
    instead of 487 KB."""
    ints, strings = {}, []
    for f in schema:
        leaf = f.type.value_type if pa.types.is_list(f.type) else f.type
        path = f"{f.name}.list.element" if pa.types.is_list(f.type) else f.name
        if pa.types.is_integer(leaf):
            ints[path] = "DELTA_BINARY_PACKED"
        elif pa.types.is_string(leaf):
            strings.append(path)
    return {"use_dictionary": strings, "column_encoding": ints}


def mixed_table(parts: list[list[tuple] | tuple[dict, int]], schema: pa.Schema) -> pa.Table:
    """Rows that came one by one (lists of tuples) and as columns ((columns, n)), in the order they came.

    Each column is built with a few numpy calls over all the parts, not a call per part: a long run
    has thousands of parts per row group.
    """
    sizes = np.array([len(p) if type(p) is list else p[1] for p in parts], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    is_rows = np.array([type(p) is list for p in parts], dtype=bool)
    rows = [row for p in parts if type(p) is list for row in p]
    by_columns = [p for p in parts if type(p) is not list]
    counts = sizes[~is_rows]

    def positions(mask: np.ndarray) -> np.ndarray:  # the rows' places in the table, for the parts in mask
        n = sizes[mask]
        return np.repeat(starts[mask], n) + np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)

    at_rows, at_columns = positions(is_rows), positions(~is_rows)
    row_columns = list(zip(*rows)) if rows else [()] * len(schema)
    arrays = []
    for i, f in enumerate(schema):
        if pa.types.is_list(f.type):  # in part order: rows' arrays and each column part's ids n times
            flat, lengths, k = [], [], iter(row_columns[i])
            for p in parts:
                if type(p) is list:
                    ids = [next(k) for _ in p]
                    flat.extend(ids)
                    lengths.append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
                else:
                    ids = np.asarray(p[0][f.name], dtype=np.int64)
                    flat.append(np.tile(ids, p[1]))
                    lengths.append(np.full(p[1], len(ids), dtype=np.int64))
            arrays.append(list_column(np.concatenate(lengths), flat))
            continue
        values = [columns[f.name] for columns, _ in by_columns]
        arrayed = [type(v) is np.ndarray for v in values]
        if not any(arrayed):
            from_columns = np.repeat(np.array(values, dtype=object if not pa.types.is_integer(f.type) else np.int64),
                                     counts)
        else:
            from_columns = np.concatenate([v if a else np.full(n, v) for v, a, n in zip(values, arrayed, counts)])
        if pa.types.is_integer(f.type) and None not in row_columns[i]:
            column = np.empty(len(at_rows) + len(at_columns), dtype=np.int64)
        else:
            column = np.empty(len(at_rows) + len(at_columns), dtype=object)
        column[at_rows] = row_columns[i]
        column[at_columns] = from_columns
        arrays.append(pa.array(column, f.type))
    return pa.table(arrays, schema=schema)


def list_column(lengths: np.ndarray, pieces: list) -> pa.ListArray:
    """A list<int64> column: row i holds lengths[i] values, taken in order from `pieces` (int64 arrays or lists)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(pieces).astype(np.int64, copy=False) if pieces else np.empty(0, dtype=np.int64)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def coded(schema: pa.Schema) -> pa.Schema:
    """The schema with its string columns as int16-coded dictionaries (see Codes)."""
    return pa.schema([pa.field(f.name, pa.dictionary(pa.int16(), pa.string())) if pa.types.is_string(f.type) else f
                      for f in schema])


class Codes(dict):
    """String -> small integer code, assigned on first sight; None -> -1 (null)."""

    def __init__(self, strings=()) -> None:
        super().__init__({None: -1})
        for text in strings:
            self[text]  # noqa: B018 (assigns its code)

    def __missing__(self, text: str) -> int:
        code = self[text] = len(self) - 1
        return code

    def column(self, codes: np.ndarray) -> pa.DictionaryArray:
        """The strings of `codes` (int16, -1: null) as an Arrow dictionary column."""
        strings = pa.array([text for text in self if text is not None], pa.string())  # in code order
        codes = np.ascontiguousarray(codes, dtype=np.int16)
        valid = codes >= 0
        # a validity bitmap made here: pa.array(codes, mask=...) took 0.5 s per 2.5 million codes
        bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        indices = pa.Array.from_buffers(pa.int16(), len(codes), [bitmap, pa.py_buffer(codes)])
        return pa.DictionaryArray.from_arrays(indices, strings)
