"""A rendered argv checked against an engine version's flag table.

Walks the options the way argparse (or llama.cpp's parser) would: each
option must be defined by that version, take a value exactly when the engine
says it does, and, where the engine declares choices, take one of them. An
option the version removed names its replacement when the table knows it.

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from llmgw.engines.tables import Table


def problems(tokens: Sequence[str], table: Table) -> Iterator[tuple[str, str]]:
    """(option token, what is wrong) for each bad option in ``tokens``."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-"):
            yield token, f"{table.label} takes no positional argument {token!r} here"
            continue
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        option = table.options.get(name)
        if option is None and table.engine == "vllm" and "." in name:
            # vLLM's parser takes one key of a JSON config option on its own:
            # --compilation-config.mode 3 (vllm/utils/argparse_utils.py).
            parent = table.options.get(name.split(".", 1)[0])
            if parent is not None and parent.value == "required":
                option = replace(parent, name=name, choices=None)
        if option is None:
            yield token, _unknown(name, table)
            if not eq and i < len(tokens) and not tokens[i].startswith("-"):
                i += 1  # its value, if it had one
            continue
        if option.value == "none":
            if eq or (i < len(tokens) and not tokens[i].startswith("-")):
                yield token, (f"{name} takes no value in {table.label}; write it as "
                              "`true` (or `false` for its --no- form)")
                i += 0 if eq else 1
            continue
        if eq:
            given: str | None = inline
        elif option.value == "required":
            given = tokens[i] if i < len(tokens) else None
            if given is None or (given.startswith("--") and given.partition("=")[0]
                                 in table.options):
                yield token, f"{name} needs a value in {table.label}"
                continue
            i += 1
        else:
            given = tokens[i] if i < len(tokens) and not tokens[i].startswith("-") else None
            i += 1 if given is not None else 0
        if given is not None and option.choices is not None and given not in option.choices:
            yield token, (f"{name} {given!r} is not one of {table.label}'s choices: "
                          f"{', '.join(option.choices)}")


def _unknown(name: str, table: Table) -> str:
    removal = table.removed.get(name)
    key = name.lstrip("-")
    if removal is not None:
        since = ".".join(removal.since.split(".")[:2]) if table.engine == "vllm" \
            else removal.since
        message = f"`{key}` was removed in {table.label.split()[0]} {since}"
        if removal.use:
            message += f"; use {removal.use}"
        return message
    hint = ""
    close = [o for o in table.options if o.lstrip("-").startswith(key) and o.startswith("--")]
    if len(close) == 1:
        hint = f" (did you mean {close[0].lstrip('-')}?)"
    return (f"{table.label} has no option {name}{hint}; a flag newer than llmgw's table "
            "goes under unchecked_args")
