"""The one exception type that means "the user gave us something wrong", and a message it often carries."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class UserError(Exception):
    """Bad input: the CLI prints `itertrace: error: <message>` on one line and exits with status 2.

    The message names the file, flag or value at fault and what is wrong with it.
    """


def no_folder_for(path: Path) -> str | None:
    """Why a file cannot be made at `path` for want of its folder ("folder a/b does not exist", "a is a
    file, not a folder"); None when the folder is there."""
    if path.parent.is_dir():
        return None
    above = next((p for p in path.parents if p.exists()), Path("."))  # the nearest folder above that exists
    if not above.is_dir():
        return f"{above} is a file, not a folder"
    return f"folder {path.parent} does not exist"


def not_a_file(path: Path, what: str = "file") -> str | None:
    """Why `path` is no regular file to read ("a FIFO, not a file", "a symbolic link that loops"), following
    symbolic links; None when it is one. A FIFO is never opened: reading one would wait for a writer."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        return "no such file"
    except OSError as exc:
        return "a symbolic link that loops" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    if stat.S_ISREG(mode):
        return None
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a device")
    return f"{kind}, not a {what}"
