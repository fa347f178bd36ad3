"""The files the commands write: which existing path they may replace, the hidden names their work goes
under beside it until it is renamed into place, the leftovers of killed commands, and one line for a
write that fails.

A command replaces only a regular file of the kind it writes itself (a DuckDB database for `--db`,
query output for `--out`, an itertrace page for `report -o`), never a FIFO, a device node, a text file
or a database another process holds open read-write. Its work goes under `.NAME.PID.TAG` beside the
target, so that the next command writing there can tell the leftovers of a killed one (whose PID is
gone) from those of one still running.
"""
from __future__ import annotations

import csv
import enum
import errno
import gzip
import io
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from itertrace.errors import UserError, no_folder_for

# The hidden name beside a target adds at most this much to its name: ".", ".PID" (PIDs reach 4194304)
# and a tag such as ".ingest.wal" or ".abcd1234.work".
HIDDEN_NAME_EXTRA = len("..4194304.") + len("abcd1234.ingest.wal")
_HEAD_BYTES = 65_536
TIMELINE_MARK = "itertrace_export"  # the key in otherData, first in an exported timeline, that says who wrote it
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                 errno.EFBIG, errno.EIO, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ETXTBSY}
# How DuckDB words the same failures inside its own messages.
_DUCKDB_WRITE_ERRORS = re.compile(r"No space left on device|Read-only file system|Permission denied|"
                                  r"Operation not permitted|File name too long|Disk quota exceeded|File too large")


class Kind(enum.Enum):
    """What a command writes, and so what an existing file must be for the command to replace it."""

    DATABASE = "a DuckDB database"
    ROWS = "query output (a text table, CSV, JSON or Parquet file)"
    REPORT = "an itertrace HTML report"
    TIMELINE = "a timeline `itertrace export perfetto` wrote"
    COST_MODEL = "a cost model `itertrace calibrate` wrote"
    PNG = "a PNG image"


def replaceable(path: Path, kind: Kind, flag: str) -> Path:
    """The file to write for `flag PATH` (symbolic links followed), after checking that it may be written:
    absent, or a regular file of `kind` (or empty), in a folder that exists and can be written, with a
    name short enough for the hidden file beside it; a database must not be open read-write elsewhere."""
    try:
        return _replaceable(path, kind, flag)
    except OSError as exc:  # a folder that cannot be read, a loop of links
        raise UserError(f"{flag} {path}: {exc.strerror}") from None


def _replaceable(path: Path, kind: Kind, flag: str) -> Path:
    where = f"{flag} {path}"
    _check_name_length(path, where)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
        _check_name_length(path, where)
    if why := no_folder_for(path):
        raise UserError(f"{where}: {why}")
    if path.is_dir():
        raise UserError(f"{where}: is a folder; {flag} names a file")
    if path.exists():
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"{where}: is {_special(mode)}, not a regular file; {flag} writes only to a regular "
                            "file (nothing was written)")
        if path.stat().st_size and not is_kind(path, kind):
            raise UserError(f"{where}: holds something other than {kind.value}, so it is not replaced; remove "
                            "it or choose another name")
    try:  # a read-only mount, an immutable folder, no permission: found before any work is done
        hidden_file(path, "tmp").unlink()
    except OSError as exc:
        raise UserError(f"{where}: cannot write in {path.parent} ({exc.strerror})") from None
    if kind is Kind.DATABASE:
        check_not_held(path, flag)
    return path


def _check_name_length(path: Path, where: str) -> None:
    name_bytes = len(os.fsencode(path.name))
    name_max = _name_max(path.parent)
    if name_bytes + HIDDEN_NAME_EXTRA > name_max:
        raise UserError(f"{where}: file name too long ({name_bytes} bytes; this folder allows {name_max}, and "
                        f"the hidden file written beside it needs {HIDDEN_NAME_EXTRA} more)")


def is_kind(path: Path, kind: Kind) -> bool:
    """Whether the regular file `path` holds what a command writing `kind` writes."""
    if kind is Kind.TIMELINE:
        return _is_timeline(path)
    with path.open("rb") as f:
        head = f.read(_HEAD_BYTES)
        f.seek(max(0, path.stat().st_size - 8))
        tail = f.read()
    if kind is Kind.DATABASE:
        return head[8:12] == b"DUCK"
    if kind is Kind.REPORT:
        return head.startswith(b"<!DOCTYPE html>") and b'<p class="meta">Made by itertrace' in head
    if kind is Kind.PNG:
        return head.startswith(b"\x89PNG\r\n\x1a\n")
    if kind is Kind.COST_MODEL:
        return re.match(rb'\{\s*"cost_model": \{', head) is not None
    if head.startswith(b"PAR1"):
        return tail.endswith(b"PAR1")
    if b"\x00" in head:
        return False
    text = head.decode("utf-8", errors="replace")
    if re.match(r"\s*\[\s*[{\]]", text):  # JSON: an array of row objects
        return tail.rstrip().endswith(b"]")
    if re.match(r"\s*\{", text):  # a JSON object (a trace, a settings file): never rows this writes
        return False
    lines = text.splitlines()
    if len(lines) > 1 and lines[1] and set(lines[1]) <= {"-", " "}:  # a text table's rule under its header
        return True
    return _csv_like(text, complete=len(head) < _HEAD_BYTES, named_csv=path.suffix.lower() == ".csv")


def _is_timeline(path: Path) -> bool:
    """A Chrome-trace JSON object (gzipped or not) whose first key is otherData with the export's mark in it;
    another tool's trace (a Kineto file too) has traceEvents or other keys first."""
    try:
        with path.open("rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rb") if gzipped else path.open("rb") as f:
            head = f.read(4096)
    except (OSError, EOFError):  # a gzip stream cut short or not gzip after all
        return False
    return head.startswith(b'{"otherData": {"' + TIMELINE_MARK.encode() + b'": {')


def check_not_held(db: Path, flag: str = "--db") -> None:
    """UserError when another process holds the DuckDB file `db` open read-write (DuckDB's file lock)."""
    if not db.is_file():
        return
    import duckdb  # only for a database about to be replaced

    try:
        duckdb.connect(str(db), read_only=True).close()
    except duckdb.Error as exc:
        text = str(exc)
        if "lock" in text.lower():
            held = re.search(r"held in (.+?) \(PID (\d+)\)", text)
            who = f"process {held.group(2)} ({held.group(1)})" if held else "another process"
            raise UserError(f"{flag} {db}: open read-write in {who}; close it there first (nothing was "
                            "written)") from None
        if "different configuration" in text:
            raise UserError(f"{flag} {db}: open in this process; close its connection first") from None
        # any other failure (a database of a newer DuckDB, say) is not a lock: the file may be replaced


def hidden(target: Path, tag: str) -> Path:
    """The hidden name `.NAME.PID.TAG` beside `target` under which this process builds it."""
    return target.with_name(f".{target.name}.{os.getpid()}.{tag}")


def hidden_folder(target: Path, tag: str) -> Path:
    """A new hidden folder `.NAME.PID.RANDOM.TAG` beside `target`, for this process's work on it."""
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=f".{tag}", dir=target.parent))


def hidden_file(target: Path, tag: str) -> Path:
    """A new empty hidden file `.NAME.PID.RANDOM.TAG` beside `target`."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=f".{tag}", dir=target.parent)
    os.close(fd)
    return Path(name)


def remove_leftovers(target: Path) -> list[Path]:
    """Remove the hidden files and folders that commands since killed left beside `target`; returns them.

    Only those whose PID no longer runs, and for a database in the making, that no process holds open
    (a process of another PID namespace, in a container sharing the folder, has a PID that means
    nothing here)."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(\d+)\.(ingest|ingest\.wal|ingest\.tmp|\w+\.work|\w+\.tmp)")
    removed = []
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        found = pattern.fullmatch(entry.name)
        if found is None or _running(int(found.group(1))) or _held(entry):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def write_failure(exc: BaseException) -> str | None:
    """Why a write failed, in a few words, when `exc` is the file system refusing it (a full disk, a
    read-only mount, an immutable file, a name too long), whether raised by Python or by DuckDB; else None."""
    if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
        return exc.strerror or os.strerror(exc.errno)
    if type(exc).__module__.startswith(("duckdb", "_duckdb")):
        found = _DUCKDB_WRITE_ERRORS.search(str(exc))
        if found:
            return found.group(0)
    return None


def _csv_like(text: str, *, complete: bool, named_csv: bool) -> bool:
    """Whether `text` reads as CSV rows that all have as many fields as the first (a header); lines of
    text without commas read as one column, so a file of one column must be named .csv."""
    if not complete:
        text = text[: text.rfind("\n") + 1]  # the last line may be cut off
    try:
        rows = [row for row in csv.reader(io.StringIO(text)) if row]
    except csv.Error:
        return False
    return bool(rows) and all(len(row) == len(rows[0]) for row in rows) and (len(rows[0]) > 1 or named_csv)


def _special(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder if folder.is_dir() else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        return True
    return True


def _held(entry: Path) -> bool:
    """Whether a leftover database file is still open read-write somewhere (DuckDB's lock on it)."""
    if not entry.name.endswith(".ingest") or not entry.is_file():
        return False
    try:
        check_not_held(entry)
    except UserError:
        return True
    return False
