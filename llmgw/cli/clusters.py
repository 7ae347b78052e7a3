"""Loading the cluster directory for a command: one place for the --cluster flag."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmgw.cli.errors import UserError
from llmgw.engines import profiles
from llmgw.planning import fits
from llmgw.spec import loading
from llmgw.spec.models import Cluster


def add_cluster_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster", metavar="DIR", type=Path, default=Path("cluster"),
        help="cluster directory (default: ./cluster)",
    )


def load(directory: Path, reader: loading.Reader | None = None) -> Cluster:
    """The validated cluster, or a UserError listing every located problem."""
    return load_with_sources(directory, reader)[0]


def load_with_sources(directory: Path, reader: loading.Reader | None = None,
                      ) -> tuple[Cluster, loading.Sources]:
    """:func:`load`, with where each value came from (to locate warnings); through
    ``reader`` (:class:`.loading.Reader`) when given, which keeps each file's parse."""
    checks = [profiles.check, fits.check]
    try:
        if reader is not None:
            return reader.load_with_sources(directory, checks)
        return loading.load_with_sources(directory, extra_checks=checks)
    except loading.SpecErrors as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        count = len(exc.errors)
        raise UserError(f"{count} error{'s' if count != 1 else ''} in {directory}") from None
