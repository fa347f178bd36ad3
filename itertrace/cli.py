"""The `itertrace` command: one entry point, a subcommand per part of the toolkit.

Each part registers its subcommands through a `register(subparsers)` function in its own `cli.py`;
a subcommand's handler takes the parsed arguments and returns an exit status.
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from itertrace.errors import UserError

# Subpackages whose cli.py contributes subcommands, in the order `--help` lists them.
_PARTS = ("itertrace.profiler.cli", "itertrace.ingest.cli", "itertrace.queries.cli", "itertrace.queries.mapping_cli",
          "itertrace.dashboards.cli", "itertrace.demo")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2, like every other user error
        command = self.prog.removeprefix("itertrace").strip()  # main prints "itertrace: error: " itself
        raise UserError(f"{command}: {message}" if command else message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="itertrace", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module_name in _PARTS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # that part has no commands yet
                continue
            raise
        module.register(sub)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a `kill`, a job scheduler's time limit), raised where the program is, as Ctrl-C is: the
    commands clean up as they do on Ctrl-C (no half-written run directory is left)."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    on_main_thread = threading.current_thread() is threading.main_thread()  # where signals are handled
    before = signal.signal(signal.SIGTERM, _terminate) if on_main_thread else None
    try:
        return _main(argv)
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, before)


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"itertrace: error: {exc}", file=sys.stderr)
        return 2
    except _Terminated:
        print("itertrace: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("itertrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if not _interrupted(exc):
            raise
        print("itertrace: interrupted", file=sys.stderr)
        return 130


def _interrupted(exc: Exception) -> bool:
    """Ctrl-C inside a DuckDB query: DuckDB raises its own error instead of KeyboardInterrupt."""
    return type(exc).__name__ == "InterruptException" or str(exc) == "Query interrupted"


if __name__ == "__main__":
    sys.exit(main())
