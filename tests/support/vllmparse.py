"""Parse command lines with the installed vLLM's own ``vllm serve`` argument parser.

    .cache/vllm/bin/python tests/support/vllmparse.py < argvs.json

Run with the vLLM venv's interpreter (``make vllm``). Reads a JSON list of
argvs (each what follows ``vllm serve``), writes one JSON object: ``options``,
every option string the parser defines, and ``results``, for each argv
``{"ok": true}`` or ``{"ok": false, "error": "<argparse's message>"}``. The
parser is vLLM's (``make_arg_parser``, wherever the release keeps it), its
values checked by its own types and choices; nothing is started.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn


class Refused(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # before 0.31
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]

    made: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))

    def error(message: str) -> NoReturn:
        raise Refused(message)

    made.error = error  # type: ignore[method-assign]
    return made


def check(argv: list[str]) -> dict[str, Any]:
    try:
        parser().parse_args(argv)
    except Refused as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True}


def main() -> int:
    argvs = json.load(sys.stdin)
    options = sorted(parser()._option_string_actions)
    json.dump({"options": options, "results": [check(a) for a in argvs]}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
