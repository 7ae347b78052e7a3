"""Engine flag tables: which options an engine version accepts.

The tables are data, generated from the engines' released packages by
``make engine-flags`` (``tools/engine_flags``) and committed under
``llmgw/engines/flagtables/<engine>-<version>.json``. Nothing here downloads.

A profile names its engine version (``engine_version: "0.11.0"``); it is
checked against the table of the newest covered version at or below it (a
patch release shares its minor's options more often than not; the docs say so).
A version newer than every table uses the newest; one older than every table
is an error. No version at all means the newest table.

Usage::

    from llmgw.engines import tables
    table = tables.select("vllm", "0.13.1").table
    table.options["--max-model-len"].value   # "required"
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Engine = Literal["vllm", "sglang", "llama.cpp"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang", "llama.cpp")
NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp"}
DIRECTORY = Path(__file__).parent / "flagtables"
_VERSION = re.compile(r"^(\d+(?:\.\d+)*)(?:[.-]?(post|rc|dev)(\d+))?$")
_STAGES = {"dev": -2, "rc": -1, None: 0, "post": 1}


def version_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """Sortable form of ``0.5.10.post1``; raises ValueError for anything else."""
    match = _VERSION.match(version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    numbers = tuple(int(p) for p in match.group(1).split("."))
    numbers += (0,) * (3 - len(numbers))
    return numbers, _STAGES[match.group(2)], int(match.group(3) or 0)


@dataclass(frozen=True)
class Option:
    """One option string as the engine declares it."""

    name: str
    value: Literal["none", "required", "optional"]
    choices: tuple[str, ...] | None = None
    negation: str | None = None  # "--no-x" where the engine defines one
    canonical: str | None = None  # the long name this one is an alias of


@dataclass(frozen=True)
class Removal:
    since: str
    use: str | None


@dataclass(frozen=True)
class Table:
    engine: Engine
    version: str
    options: Mapping[str, Option]
    removed: Mapping[str, Removal]

    @property
    def label(self) -> str:
        return f"{NAMES[self.engine]} {self.version}"


@dataclass(frozen=True)
class Selection:
    table: Table
    asked: str | None  # the profile's engine_version, if any

    @property
    def version(self) -> str:
        """The version rendering decisions use: the profile's, else the table's."""
        return self.asked or self.table.version


class VersionError(ValueError):
    """No table can check this engine version."""


@functools.cache
def available(engine: str) -> tuple[str, ...]:
    """Versions with a table, oldest first."""
    found = [p.name[len(engine) + 1:-len(".json")]
             for p in DIRECTORY.glob(f"{engine}-*.json")]
    return tuple(sorted(found, key=version_key))


@functools.cache
def load(engine: str, version: str) -> Table:
    data = json.loads((DIRECTORY / f"{engine}-{version}.json").read_text())
    options = {
        name: Option(name, entry["value"],
                     tuple(entry["choices"]) if entry.get("choices") is not None else None,
                     entry.get("negation"), entry.get("canonical"))
        for name, entry in data["options"].items()
    }
    removed = {name: Removal(entry["since"], entry.get("use"))
               for name, entry in data.get("removed", {}).items()}
    return Table(data["engine"], data["version"], options, removed)


def select(engine: str, version: str | None) -> Selection:
    """The table that checks ``engine`` at ``version``; raises :class:`VersionError`."""
    versions = available(engine)
    if not versions:
        raise VersionError(f"no flag tables for {NAMES.get(engine, engine)}")
    if version is None:
        return Selection(load(engine, versions[-1]), None)
    try:
        key = version_key(version)
    except ValueError:
        raise VersionError(f"engine_version {version!r} is not a version such as "
                           f"{versions[-1]!r}") from None
    older = [v for v in versions if version_key(v) <= key]
    if not older:
        raise VersionError(
            f"{NAMES[engine]} {version} is older than every flag table llmgw has "
            f"({', '.join(versions)}); use a newer engine, or generate its table with "
            "`make engine-flags`")
    return Selection(load(engine, older[-1]), version)


def at_least(version: str, minimum: str) -> bool:
    return version_key(version) >= version_key(minimum)
