"""Fingerprints of every table an ingest writes, computed in SQL: rows, and order-independent hashes.

A table's fingerprint is its columns (names and types; an MD5 of them for nsys's own tables), its row count, and the sum modulo 2**64 of one
64-bit MD5 per row over the text of all its columns; a normalized table also gets that sum per column,
so that a mismatch names the column. Paths of the machine that ingested (`capture_meta.source`,
`run_meta.source`, and the rows of nsys's export metadata that name the report's path) are left
out, so that fingerprints do not depend on where the project lies. `python tests/ingest_fingerprints.py` writes the expected fingerprints
of every real sample to `ingest_fingerprints.json` (run it only when a change to the tables is meant).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
SHARED_SAMPLES = ROOT.parent / "shared" / "nsys_samples"
SAMPLE_TRACES = ROOT / "sample_traces"
EXPECTED = Path(__file__).with_name("ingest_fingerprints.json")
MACHINE_COLUMNS = {"capture_meta": ("source",), "run_meta": ("source",)}  # paths of the ingesting machine
MACHINE_ROWS = {name: "name NOT LIKE 'EXPORT_INPUT_PATH%'" for name in ("EXPORT_META_DATA", "META_DATA_EXPORT")}
NULL_TEXT = "\\N"
MOD = 2**64


def samples() -> dict[str, list[Path]]:
    """Every real sample: its name and the sources ingested together."""
    found = {f"nsys_samples/{p.parent.name}/{p.name}": [p] for p in sorted(SHARED_SAMPLES.glob("arrow_2022.4/*.arrow"))}
    found |= {f"nsys_samples/{p.name}": [p] for p in sorted(SHARED_SAMPLES.glob("*_pqtdir"))}
    for folder in sorted(SAMPLE_TRACES.glob("worked-example-*")):
        found[f"sample_traces/{folder.name}"] = [folder / "run", folder / "report.nsys-rep"]
    return found


def _text(column: str) -> str:
    return f"coalesce(CAST(\"{column}\" AS VARCHAR), '{NULL_TEXT}')"


def _sum(expression: str) -> str:
    return f"coalesce(sum(md5_number_lower({expression})), 0)"


def table_fingerprint(con: duckdb.DuckDBPyConnection, schema: str, table: str, per_column: bool) -> dict:
    """One table's fingerprint: columns, rows, the row hash and (if `per_column`) one hash per column."""
    columns = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE schema_name = ? AND table_name = ? "
        "AND database_name = current_database() ORDER BY column_index", [schema, table]).fetchall()
    if not columns:  # a view: duckdb_columns lists tables only
        described = con.execute(f'DESCRIBE "{schema}"."{table}"').fetchall()
        columns = [(row[0], row[1]) for row in described]
    kept = [name for name, _ in columns if name not in MACHINE_COLUMNS.get(table, ())]
    row_text = "concat_ws(chr(31), " + ", ".join(_text(c) for c in kept) + ")"
    sums = [_sum(row_text)] + ([_sum(_text(c)) for c in kept] if per_column else [])
    where = MACHINE_ROWS.get(table, "true") if schema == "nsys" else "true"
    rows, *hashes = con.execute(f'SELECT count(*), {", ".join(sums)} FROM "{schema}"."{table}" WHERE {where}').fetchone()
    names = ", ".join(f"{name} {kind}" for name, kind in columns)
    out = {"rows": rows, "hash": f"{int(hashes[0]) % MOD:016x}"}
    if per_column:  # spelt out, so that a mismatch names the column
        out["columns"] = names
        if rows:
            out["column_hashes"] = {c: f"{int(h) % MOD:016x}" for c, h in zip(kept, hashes[1:])}
    else:
        out["columns_md5"] = hashlib.md5(names.encode()).hexdigest()[:16]
    return out


def database_fingerprint(db: Path, normalized: list[str]) -> dict[str, dict]:
    """{schema.table: fingerprint} of every table and view of the database, nsys's included."""
    with duckdb.connect(str(db), read_only=True) as con:
        names = con.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_catalog = current_database() ORDER BY ALL").fetchall()
        return {f"{schema}.{table}": table_fingerprint(con, schema, table, schema == "main" and table in normalized)
                for schema, table in names if not table.startswith("_")}


def fingerprint_sources(sources: list[Path], workdir: Path) -> dict[str, dict]:
    """Ingest `sources` into a new database under `workdir` and fingerprint it."""
    from itertrace.ingest import ingest, normalized_tables

    db = workdir / "fingerprint.duckdb"
    ingest(sources, db)
    try:
        return database_fingerprint(db, normalized_tables())
    finally:
        db.unlink()


def nsys_version() -> str | None:
    """The installed nsys's version, which the fingerprints of .nsys-rep samples depend on."""
    if shutil.which("nsys") is None:
        return None
    from itertrace.ingest.nsys import find_nsys

    return str(find_nsys().version)


def main() -> None:
    """Write the fingerprints of every sample found to ingest_fingerprints.json."""
    out = {"nsys_version": nsys_version(), "samples": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for name, sources in samples().items():
            print(name, file=sys.stderr)
            out["samples"][name] = fingerprint_sources(sources, Path(workdir))
    EXPECTED.write_text(_dumps(out))


def _dumps(out: dict) -> str:
    """The fingerprints as JSON with one line per table, so that a diff shows which tables changed."""
    lines = ["{", f' "nsys_version": {json.dumps(out["nsys_version"])},', ' "samples": {']
    for i, (name, tables) in enumerate(out["samples"].items()):
        lines.append(f"  {json.dumps(name)}: {{")
        rows = [f"   {json.dumps(table)}: {json.dumps(fp, sort_keys=True)}" for table, fp in sorted(tables.items())]
        lines.append(",\n".join(rows))
        lines.append("  }" + ("," if i < len(out["samples"]) - 1 else ""))
    return "\n".join(lines + [" }", "}"]) + "\n"


if __name__ == "__main__":
    main()
