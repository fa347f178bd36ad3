"""The one exception type that means "the user gave us something wrong", and a message it often carries."""
from __future__ import annotations

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
