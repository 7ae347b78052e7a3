"""``llmgw schema``: the JSON Schema of a cluster file, for editors and CI."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw.spec import schemas


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "schema", help="print the JSON Schema of cluster files",
        description="Print the JSON Schema (draft-07) of one cluster file. Point "
        "yaml-language-server at it to get completion and checks in your editor "
        "(see docs/cluster-reference.md).",
    )
    parser.add_argument("--out", type=Path, metavar="FILE", help="write to FILE, not stdout")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    text = schemas.dumps()
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0
