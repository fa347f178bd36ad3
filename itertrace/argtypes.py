"""Flag value types shared by the subcommands' parsers."""
from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(least: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `least`; anything else gets one line saying so."""
    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {least}, not {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {least}, not {value}")
        return value

    integer.__name__ = f"integer of at least {least}"
    return integer
