"""SQL files whose tables and views document themselves: `--` comments above CREATE and above each column.

A file is a sequence of statements, each ending with `;` at the end of a line of code. The comment lines
directly above `CREATE TABLE name (` (or `CREATE VIEW name (`, whose list names the view's columns)
document the table, and the comment lines directly above a column inside it document that column;
`comment_statements` turns them into `COMMENT ON` statements, so the documentation travels inside the
database file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_CREATE = re.compile(r"^CREATE (TABLE|VIEW) (\w+) \($", re.IGNORECASE)
_COLUMN = re.compile(r"^(\w+)(?:\s+[A-Z]|,?$)")  # `name TYPE` in a table, `name,` in a view


@dataclass(frozen=True)
class TableDoc:
    """A table's documentation as written above its definition and its columns."""

    table: str
    text: str
    columns: dict[str, str]
    kind: str = "TABLE"  # or "VIEW"


def statements(sql: str) -> list[str]:
    """The statements of `sql`, split at each `;` that ends a line of code (not of a comment)."""
    parts: list[str] = []
    current: list[str] = []
    for line in sql.splitlines():
        code = line.strip()
        if code.endswith(";") and not code.startswith("--"):
            current.append(line.rstrip()[:-1])
            parts.append("\n".join(current))
            current = []
        else:
            current.append(line)
    parts.append("\n".join(current))
    return [part.strip() for part in parts if _has_code(part)]


def table_docs(sql: str) -> list[TableDoc]:
    """The documented tables of `sql`, in the order it defines them."""
    docs: list[TableDoc] = []
    comment: list[str] = []
    table: str | None = None
    kind = "TABLE"
    table_text = ""
    columns: dict[str, str] = {}
    for raw in sql.splitlines():
        line = raw.strip()
        if line.startswith("--"):
            comment.append(line[2:].strip())
            continue
        if table is None:
            if created := _CREATE.match(line):
                kind, table, table_text, columns = created.group(1).upper(), created.group(2), " ".join(comment), {}
            comment = []
        elif line.startswith(")"):
            docs.append(TableDoc(table, table_text, columns, kind))
            table, comment = None, []
        elif column := _COLUMN.match(line):
            columns[column.group(1)] = " ".join(comment)
            comment = []
    return docs


def comment_statements(sql: str) -> list[str]:
    """`COMMENT ON TABLE` and `COMMENT ON COLUMN` statements for every documented table of `sql`."""
    out: list[str] = []
    for doc in table_docs(sql):
        out.append(f"COMMENT ON {doc.kind} {doc.table} IS {literal(doc.text)}")
        out.extend(f"COMMENT ON COLUMN {doc.table}.{name} IS {literal(text)}" for name, text in doc.columns.items())
    return out


def _has_code(part: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in part.splitlines())


def literal(text: str) -> str:
    """`text` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
