"""The `itertrace` command: one entry point, a subcommand per part of the toolkit.

Each part registers its subcommands through a `register(subparsers)` function in its own `cli.py`;
a subcommand's handler takes the parsed arguments and returns an exit status.
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys

from itertrace.errors import UserError
from itertrace.interrupts import Signals

# Subpackages whose cli.py contributes subcommands, in the order `--help` lists them, each with the commands it
# adds: a command builds its own part's parser only, not every part's (a test checks them against `register`).
PARTS = {"itertrace.profiler.cli": ("run", "calibrate"), "itertrace.experiments.cli": ("experiment",),
         "itertrace.ingest.cli": ("ingest", "profile"), "itertrace.queries.cli": ("query", "sql"),
         "itertrace.queries.mapping_cli": ("mapping",), "itertrace.dashboards.cli": ("export", "report"),
         "itertrace.fleet.cli": ("fleet",), "itertrace.demo": ("demo",)}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2, like every other user error
        command = self.prog.removeprefix("itertrace").strip()  # main prints "itertrace: error: " itself
        raise UserError(f"{command}: {message}" if command else message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every part, or of the part that adds `command` only, where one does."""
    parser = _Parser(prog="itertrace", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    own = [name for name, commands in PARTS.items() if command in commands]
    for module_name in own or PARTS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # that part has no commands yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    with Signals().installed() as signals:
        return _main(argv, signals)


def _main(argv: list[str] | None, signals: Signals) -> int:
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        return int(args.func(args) or 0)
    except UserError as exc:
        if signals.received is not None:  # a failure the signal caused, reported in words of its own
            return _signalled(signals.received)
        print(f"itertrace: error: {exc}", file=sys.stderr)
        return 2
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:
        if signals.received is not None or isinstance(exc, KeyboardInterrupt) or _interrupted(exc):
            return _signalled(signals.received if signals.received is not None else signal.SIGINT)
        if isinstance(exc, BrokenPipeError):
            return 0
        if line := _environment_error(exc):
            print(f"itertrace: error: {line}", file=sys.stderr)
            return 1
        raise


def _signalled(signum: int) -> int:
    print("itertrace: terminated" if signum == signal.SIGTERM else "itertrace: interrupted", file=sys.stderr)
    return 128 + signum


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C inside a DuckDB query: DuckDB raises its own error instead of KeyboardInterrupt."""
    return type(exc).__name__ == "InterruptException" or str(exc) == "Query interrupted"


def _environment_error(exc: BaseException) -> str | None:
    """One line for what the machine refused, where no command said more: a write the file system refused
    (full, read-only, not permitted), or memory that ran out."""
    from itertrace.targets import write_failure

    if why := write_failure(exc):
        where = getattr(exc, "filename", None)
        return f"{where}: {why}" if where else f"cannot write ({why})"
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryException":
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "MemoryError"
        return f"out of memory ({detail})"
    return None


if __name__ == "__main__":
    sys.exit(main())
