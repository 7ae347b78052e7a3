"""The ``llmgw`` command.

Each subcommand lives in its own module under :mod:`llmgw.cli` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` to a
function ``(args) -> int`` (the exit code). Errors the user can fix are
raised as :class:`llmgw.cli.errors.UserError` and printed here, once, without
a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from llmgw import __version__
from llmgw.cli.errors import UserError

# Subcommand modules, in the order `llmgw --help` lists them. A module that
# does not exist yet is skipped, so commands land one issue at a time.
COMMANDS = (
    "validate",
    "schema",
    "plan",
    "apply",
    "history",
    "audit",
    "inventory",
    "status",
    "logs",
    "serve",
    "agent",
    "keys",
    "usage",
    "store",
    "init",
    "node",
    "doctor",
    "lab",
    "weights",
    "engine",
    "mirror",
    "models",
    "users",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw",
        description="Declarative LLM serving for GPU fleets you own.",
    )
    parser.add_argument("--version", action="version", version=f"llmgw {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"llmgw.cli.{name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name != f"llmgw.cli.{name}_cmd":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`llmgw plan | head`): nothing left to say, and
        # Python must not complain when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # what a shell reports for a command ended by SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
