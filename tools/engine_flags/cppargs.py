"""llama-server's options, read from llama.cpp's ``common/arg.cpp``.

Every option is an ``add_opt(common_arg(...))`` call. The ``common_arg``
constructor used says what the option takes (``common/arg.h``):

* ``({names}, help, handler)`` — a bare flag;
* ``({names}, {negations}, help, handler)`` — a boolean with ``--no-`` forms;
* ``({names}, value_hint, help, handler)`` — one value;
* ``({names}, hint, hint2, help, handler)`` — two values.

An option belongs to llama-server when its ``set_examples`` names
``LLAMA_EXAMPLE_SERVER`` or ``LLAMA_EXAMPLE_COMMON`` (the default) and its
``set_excludes`` does not name the server; ``set_preset_only`` options are not
command-line options. llama.cpp declares no choices, so none are recorded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

Option = dict[str, Any]
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_LISTS = re.compile(
    r"static\s+std::initializer_list<enum\s+llama_example>\s+(\w+)\s*=\s*\{([^}]*)\}", re.S)


def _skip_literal(text: str, i: int) -> int:
    quote = text[i]
    i += 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _closing(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``start``."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = [pairs[text[start]]]
    i = start + 1
    while stack:
        ch = text[i]
        if ch in "\"'":
            if ch == '"' and text[i - 1] == "R":  # raw string R"(...)"
                end = text.index(')"', i)
                i = end + 2
                continue
            i = _skip_literal(text, i)
            continue
        if text.startswith("//", i):
            i = text.index("\n", i)
            continue
        if text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch == stack[-1]:
            stack.pop()
        i += 1
    return i


def _top_level_args(text: str) -> list[str]:
    """Split ``a, {b, c}, f(d, e)`` at top-level commas."""
    out, depth, current, i = [], 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            end = _skip_literal(text, i)
            current.append(text[i:end])
            i = end
            continue
        if text.startswith("//", i):
            i = text.index("\n", i) if "\n" in text[i:] else len(text)
            continue
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    if "".join(current).strip():
        out.append("".join(current).strip())
    return out


def options(
    source: str, example: str = "LLAMA_EXAMPLE_SERVER"
) -> Iterator[tuple[list[str], Option]]:
    lists = {name: set(re.findall(r"LLAMA_EXAMPLE_\w+", body))
             for name, body in _LISTS.findall(source)}
    for match in re.finditer(r"add_opt\s*\(\s*common_arg\s*\(", source):
        open_paren = match.end() - 1
        close = _closing(source, open_paren)
        args = _top_level_args(source[open_paren + 1:close - 1])
        end_of_opt = _closing(source, source.index("(", match.start()))
        tail = source[close:end_of_opt]
        if not args or not args[0].startswith("{"):
            continue
        names = _STRING.findall(args[0])
        examples = {"LLAMA_EXAMPLE_COMMON"}
        excludes: set[str] = set()
        for method, target in (("set_examples", "examples"), ("set_excludes", "excludes")):
            call = re.search(rf"\.{method}\s*\(\s*(\{{[^}}]*\}}|\w+)\s*\)", tail)
            if call is None:
                continue
            body = call.group(1)
            found = set(re.findall(r"LLAMA_EXAMPLE_\w+", body)) if body.startswith("{") \
                else lists.get(body, set())
            if target == "examples":
                examples = found
            else:
                excludes = found
        if ".set_preset_only()" in tail:
            continue
        if not ({example, "LLAMA_EXAMPLE_COMMON"} & examples) or example in excludes:
            continue
        option: Option
        negations: list[str] = []
        if len(args) == 4 and args[1].startswith("{"):
            negations = _STRING.findall(args[1])
            option = {"value": "none"}
        elif len(args) <= 3:
            option = {"value": "none"}
        elif len(args) == 4:
            option = {"value": "required"}
        else:
            option = {"value": "required", "values": 2}
        if negations:
            option["negation"] = negations[0]
        yield names, option
        for negation in negations:
            yield [negation], {"value": "none", "canonical": names[0], "negates": True}


def table(declared: Iterator[tuple[list[str], Option]]) -> dict[str, Option]:
    out: dict[str, Option] = {}
    for names, option in declared:
        long_names = [n for n in names if n.startswith("--")]
        canonical = long_names[0] if long_names else names[0]
        entry = {k: v for k, v in option.items() if k != "negates"}
        if "canonical" in entry:
            out.setdefault(canonical, entry)
            continue
        out.setdefault(canonical, entry)
        for alias in names:
            if alias != canonical:
                out.setdefault(alias, {**entry, "canonical": canonical})
    return dict(sorted(out.items()))
