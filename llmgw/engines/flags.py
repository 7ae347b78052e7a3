"""A profile's ``args`` as command-line flags, spelled as the engine defines them.

``max-model-len: 8192`` becomes ``--max-model-len 8192``; ``true`` is a bare
flag; null leaves the flag out. ``false`` becomes the engine's negation
(``enable-prefix-caching: false`` → ``--no-enable-prefix-caching``) where the
engine version defines one, and is an error where it does not: silently
dropping it would leave the engine's default on. A key is written with one
dash when the engine defines it that way (llama.cpp's ``-fa``, ``-ngl``), two
otherwise. Keys are sorted so that reordering a YAML map never changes a
unit's digest (and never restarts an engine for nothing).

``unchecked_args`` render the same way after ``args`` but are not looked up
in the table: they are the escape hatch for flags newer than llmgw's tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.engines.tables import Option, Table
from llmgw.spec.loras import LoraAdapter
from llmgw.spec.models import ArgValue


@dataclass
class Rendered:
    argv: list[str] = field(default_factory=list)
    # (where, message): where is the key under args / unchecked_args.
    problems: list[tuple[str, str]] = field(default_factory=list)


def spelling(key: str, table: Table | None) -> str:
    """``max-model-len`` → ``--max-model-len``; ``fa`` → ``-fa`` where only that exists."""
    if key.startswith("-"):
        return key  # written out by the user: taken as is
    if table is not None:
        for candidate in (f"--{key}", f"-{key}"):
            if candidate in table.options:
                return candidate
    return f"-{key}" if len(key) == 1 else f"--{key}"


def value(item: int | float | str) -> str:
    if isinstance(item, float) and item.is_integer():
        # 1.0 and 1 mean the same to every engine; spell it one way.
        return str(int(item))
    return str(item)


def render(
    args: Mapping[str, ArgValue], table: Table | None, *, section: str = "args"
) -> Rendered:
    """Flags for ``args``, sorted by name; ``table`` None means unchecked."""
    out = Rendered()
    for key in sorted(args, key=lambda k: k.lstrip("-")):
        item = args[key]
        if item is None:
            continue
        flag = spelling(key, table)
        option = table.options.get(flag) if table is not None else None
        if item is False:
            negation = _negation(option, table)
            if negation is None:
                what = f"{table.label} defines no {_no_form(flag)}" if table is not None else \
                    "unchecked flags are written as they are"
                out.problems.append((f"{section}.{key}",
                                     f"{section}.{key}: false would need {_no_form(flag)}, but "
                                     f"{what}; remove the key to keep the engine's default"))
                continue
            out.argv.append(negation)
            continue
        out.argv.append(flag)
        if item is not True:
            out.argv.append(value(item))
    return out


def _no_form(flag: str) -> str:
    return "--no-" + flag.lstrip("-")


def _negation(option: Option | None, table: Table | None) -> str | None:
    """The --no- form of ``option``: its own, else its canonical long name's."""
    if table is None or option is None:
        return None
    if option.negation:
        return option.negation
    if option.canonical:
        canonical = table.options.get(option.canonical)
        if canonical is not None and canonical.negation:
            return canonical.negation
    return None


# The argv word for weights the node's agent fetched: it sets the variable to
# the local path (a snapshot directory or a file) in the unit's env file.
WEIGHTS = "${LLMGW_WEIGHTS}"


def is_path(source: str) -> bool:
    """A weights source on the node's disk, rather than a repository id."""
    return source.startswith("/") or source == WEIGHTS


def adapter_options(adapters: Sequence[LoraAdapter], paths_flag: str) -> list[list[str]]:
    """vLLM's and SGLang's adapter options: ``--enable-lora``, ``PATHS_FLAG name=path ...``
    and ``--max-lora-rank`` (the largest rank declared), as :class:`Parts` ``multi`` groups."""
    if not adapters:
        return []
    groups = [["--enable-lora"], [paths_flag, *(f"{a.name}={a.source}" for a in adapters)]]
    ranks = [a.rank for a in adapters if a.rank is not None]
    if ranks:
        groups.append(["--max-lora-rank", str(max(ranks))])
    return groups
