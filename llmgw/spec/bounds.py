"""Resource bounds for files others write: cluster YAML, saved plans, fleet snapshots.

Cluster files arrive in pull requests from strangers and CI plans them; a
saved plan or a fleet snapshot is a file anyone can hand to ``llmgw``. None
may make llmgw run for minutes or take gigabytes. Each is refused, quickly
and with its place, when it is bigger, deeper or (YAML) expands to more than
the bounds below — all far above any real cluster (the example cluster, 11
nodes and 5 models, holds 396 values).

YAML is checked on its event stream *before* it is composed: every alias
counts as many values as its anchor expands to, so "nine levels of nine
aliases" (9⁹ values from 90 lines) stops at the alias that crosses the bound,
after reading a few hundred events. JSON is checked for size and nesting
depth before it is parsed.

A purely computational module, apart from :func:`read_text` (one ``stat``
and one bounded read).
"""

from __future__ import annotations

import re
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    ScalarEvent,
)

YAML_MAX_BYTES = 1024 * 1024  # one cluster file
YAML_MAX_DIRECTORY_BYTES = 16 * 1024 * 1024  # all of a cluster directory's files
YAML_MAX_ALIASES = 1_000
YAML_MAX_VALUES = 100_000  # scalars and collections, aliases expanded, in one file
YAML_MAX_DIRECTORY_VALUES = 500_000  # the same, in all of a cluster directory's files
YAML_MAX_DEPTH = 32
JSON_MAX_BYTES = 64 * 1024 * 1024  # a saved plan carries every unit's text
JSON_MAX_DEPTH = 64

_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


class BoundError(ValueError):
    """A file past a bound; ``line`` and ``col`` (1-based) say where it crossed it."""

    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line, self.col, self.message = line, col, message


def read_text(path: Path, limit: int) -> str:
    """The file's text, refused (BoundError at 1:1) when it is bigger than ``limit`` bytes.

    OSError and UnicodeDecodeError pass through for the caller to word.
    """
    size = path.stat().st_size
    if size > limit:
        raise BoundError(1, 1, f"file is {_size(size)}; llmgw reads at most {_size(limit)} "
                         "from a file of this kind")
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew since the stat
        raise BoundError(1, 1, f"file is over {_size(limit)}")
    return data.decode("utf-8")


def check_yaml(text: str, directory_left: int = YAML_MAX_DIRECTORY_VALUES) -> int:
    """How many values ``text`` expands to; BoundError when it nests or expands past the
    YAML bounds, or past ``directory_left``, what the directory's other files left.

    Syntax errors are left for the real parse, which words them better (0 is returned).
    """
    limit = min(YAML_MAX_VALUES, directory_left)
    where = "the file" if limit == YAML_MAX_VALUES else "the cluster directory"
    bound = YAML_MAX_VALUES if limit == YAML_MAX_VALUES else YAML_MAX_DIRECTORY_VALUES
    anchors: dict[str, int] = {}
    starts: list[tuple[str | None, int]] = []  # (anchor, values counted before it opened)
    values = aliases = 0
    try:
        for event in YAML(typ="rt").parse(text):
            mark = event.start_mark
            if isinstance(event, AliasEvent):
                aliases += 1
                if aliases > YAML_MAX_ALIASES:
                    raise BoundError(mark.line + 1, mark.column + 1,
                                     f"more than {YAML_MAX_ALIASES:,} aliases in one file")
                size = anchors.get(event.anchor, 1)
                values += size
                if values > limit:
                    raise BoundError(mark.line + 1, mark.column + 1,
                                     f"alias *{event.anchor} ({size:,} values) expands "
                                     f"{where} past {bound:,} values")
            elif isinstance(event, ScalarEvent):
                values += 1
                if event.anchor:
                    anchors[event.anchor] = 1
            elif isinstance(event, CollectionStartEvent):
                values += 1
                starts.append((event.anchor, values))
                if len(starts) > YAML_MAX_DEPTH:
                    raise BoundError(mark.line + 1, mark.column + 1,
                                     f"nested more than {YAML_MAX_DEPTH} levels deep")
            elif isinstance(event, CollectionEndEvent) and starts:
                anchor, before = starts.pop()
                if anchor:
                    anchors[anchor] = values - before + 1
            if values > limit:
                raise BoundError(mark.line + 1, mark.column + 1,
                                 f"{where} holds more than {bound:,} values")
    except YAMLError:
        return 0
    return values


def check_json(text: str) -> None:
    """Raise BoundError when ``text`` nests arrays and objects past JSON_MAX_DEPTH."""
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        char = token.group(0)
        if char in "[{":
            depth += 1
            if depth > JSON_MAX_DEPTH:
                line = text.count("\n", 0, token.start()) + 1
                col = token.start() - (text.rfind("\n", 0, token.start()) + 1) + 1
                raise BoundError(line, col, f"nested more than {JSON_MAX_DEPTH} levels deep")
        elif char in "]}":
            depth -= 1


def _size(count: int) -> str:
    return f"{count / 1024 / 1024:.1f} MiB" if count >= 1024 * 1024 else f"{count:,} bytes"
