"""A profile's ``args`` as command-line flags.

``max-model-len: 8192`` becomes ``--max-model-len 8192``; ``true`` is a bare
flag; ``false`` and null leave the flag out. Keys are sorted so that
reordering a YAML map never changes a unit's digest (and never restarts an
engine for nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.spec.models import ArgValue


def flag(key: str) -> str:
    """``max-model-len`` → ``--max-model-len``; a one-letter key is a short flag."""
    name = key.lstrip("-")
    return f"-{name}" if len(name) == 1 else f"--{name}"


def value(item: int | float | str) -> str:
    if isinstance(item, float) and item.is_integer():
        # 1.0 and 1 mean the same to every engine; spell it one way.
        return str(int(item))
    return str(item)


def render(args: Mapping[str, ArgValue]) -> list[str]:
    """Flags for ``args``, sorted by name."""
    out: list[str] = []
    for key in sorted(args, key=lambda k: k.lstrip("-")):
        item = args[key]
        if item is None or item is False:
            continue
        out.append(flag(key))
        if item is not True:
            out.append(value(item))
    return out


# The argv word for weights the node's agent fetched: it sets the variable to
# the local path (a snapshot directory or a file) in the unit's env file.
WEIGHTS = "${LLMGW_WEIGHTS}"


def is_path(source: str) -> bool:
    """A weights source on the node's disk, rather than a repository id."""
    return source.startswith("/") or source == WEIGHTS
