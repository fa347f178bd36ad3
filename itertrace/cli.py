"""The `itertrace` command: one entry point, a subcommand per part of the toolkit.

Each part registers its subcommands through a `register(subparsers)` function in its own `cli.py`;
a subcommand's handler takes the parsed arguments and returns an exit status.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from itertrace.errors import UserError

# Subpackages whose cli.py contributes subcommands, in the order `--help` lists them.
_PARTS = ("itertrace.profiler.cli", "itertrace.ingest.cli", "itertrace.queries.cli", "itertrace.dashboards.cli",
          "itertrace.demo")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2, like every other user error
        raise UserError(f"{self.prog}: {message}")


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


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"itertrace: error: {exc}", file=sys.stderr)
        return 2
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
