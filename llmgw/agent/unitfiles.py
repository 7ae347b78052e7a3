"""Rendered systemd units, read back: sections, labels, command line, environment.

Pure functions over text. The systemd backend only needs the labels (which
unit is which shard); the supervise backend runs the unit itself and so
needs what systemd would derive from it: ``ExecStart`` split and expanded
the way systemd does, ``Environment=`` assignments, ``EnvironmentFile=``
paths, the working directory and the stop timeout. Lines end where systemd
ends them (LF, CR, CRLF, NUL), and :func:`shape_problems` compares a unit's
keys with those the unit template writes (:data:`KEYS`, read from the
template shipped with llmgw), so the agent can refuse any other shape.

>>> split_command('/usr/bin/engine --name "two words" --port 18000')
['/usr/bin/engine', '--name', 'two words', '--port', '18000']
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources

NAME = re.compile(r"^llmgw-[a-z0-9][a-z0-9._-]*-r\d+-s\d+\.service$")
_EOL = re.compile(r"\r\n|[\r\n\x00]")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BARE_VAR = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(us|ms|seconds|second|sec|s|minutes|minute|min|m|"
                   r"hours|hour|hr|h|days|day|d)?\s*")
_SPAN_UNITS = {
    "us": 1e-6, "ms": 1e-3, "seconds": 1, "second": 1, "sec": 1, "s": 1, None: 1,
    "minutes": 60, "minute": 60, "min": 60, "m": 60,
    "hours": 3600, "hour": 3600, "hr": 3600, "h": 3600, "days": 86400, "day": 86400, "d": 86400,
}


class UnitFileError(ValueError):
    """A unit the agent cannot use; the message names the unit and the problem."""


@dataclass(frozen=True)
class Labels:
    """What llmgw wrote into ``[Unit]`` to recognise its own units."""

    model: str
    replica: int
    rank: int
    digest: str
    port: int | None
    raw: Mapping[str, str] = field(default_factory=dict)  # every X-Llmgw-* key, as written


@dataclass(frozen=True)
class UnitFile:
    name: str
    sections: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def values(self, section: str, key: str) -> list[str]:
        return [v for k, v in self.sections.get(section, ()) if k == key]

    def value(self, section: str, key: str) -> str | None:
        """The last assignment of ``key`` (systemd's rule for single-valued settings)."""
        found = self.values(section, key)
        return found[-1] if found else None


def lines(text: str) -> list[str]:
    """Lines as systemd reads a unit file: ended by LF, CR, CRLF or NUL — and by
    nothing else (Python's ``splitlines`` also splits at U+2028, VT, FF and more)."""
    found = _EOL.split(text)
    return found[:-1] if found and found[-1] == "" else found


def parse(name: str, text: str) -> UnitFile:
    """Sections and assignments of a unit file, in order, continuations joined."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for number, raw in enumerate(lines(text), start=1):
        stripped = raw.strip(_SEPARATORS)
        if pending and stripped[:1] in ("#", ";"):
            continue  # systemd skips a comment line inside a continuation
        line, pending = pending + stripped, ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise UnitFileError(f"{name}:{number}: malformed section header {line!r}")
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        if not sep or current is None:
            raise UnitFileError(f"{name}:{number}: expected Key=value inside a section: {line!r}")
        current.append((key.strip(_SEPARATORS), value.strip(_SEPARATORS)))
    return UnitFile(name, {k: tuple(v) for k, v in sections.items()})


def _int_label(unit: UnitFile, key: str, required: bool) -> int | None:
    raw = unit.value("Unit", key)
    if raw is None:
        if required:
            raise UnitFileError(f"{unit.name}: [Unit] has no {key}=")
        return None
    if not raw.isdigit():
        raise UnitFileError(f"{unit.name}: {key}={raw} is not a whole number")
    return int(raw)


def labels(unit: UnitFile) -> Labels:
    """The ``X-Llmgw-*`` labels; raises UnitFileError when one is missing or malformed."""
    model = unit.value("Unit", "X-Llmgw-Model")
    digest = unit.value("Unit", "X-Llmgw-Digest")
    if not model:
        raise UnitFileError(f"{unit.name}: [Unit] has no X-Llmgw-Model=")
    if not digest:
        raise UnitFileError(f"{unit.name}: [Unit] has no X-Llmgw-Digest=")
    replica = _int_label(unit, "X-Llmgw-Replica", required=True)
    rank = _int_label(unit, "X-Llmgw-Rank", required=False)
    port = _int_label(unit, "X-Llmgw-Port", required=False)
    if port is not None and not 1 <= port <= 65535:
        raise UnitFileError(f"{unit.name}: X-Llmgw-Port={port} is not a TCP port")
    raw = {k: v for k, v in unit.sections.get("Unit", ()) if k.startswith("X-Llmgw-")}
    return Labels(model, replica or 0, rank or 0, digest, port, raw)


_SEPARATORS = " \t\n\r"
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                   "v": "\v", "s": " "}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def _unescape(value: str, i: int) -> tuple[str, int]:
    """The C escape starting after the backslash at ``value[i]`` and the index past it.

    systemd's ``cunescape_one``: ``\\n``, ``\\xNN``, ``\\uNNNN``, ``\\UNNNNNNNN``,
    ``\\NNN`` octal; an unknown escape stands for its character. NUL is refused.
    """
    char = value[i]
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], i + 1
    width = _HEX_ESCAPES.get(char)
    digits, base = (value[i + 1:i + 1 + width], 16) if width else (value[i:i + 3], 8)
    if width or (len(digits) == 3 and all(d in "01234567" for d in digits)):
        try:
            code = int(digits, base)
        except ValueError:
            raise UnitFileError(f"invalid escape in {value!r}") from None
        if len(digits) != (width or 3) or code == 0 or code > 0x10FFFF:
            raise UnitFileError(f"invalid escape in {value!r}")
        return chr(code), i + 1 + (width or 2)
    return char, i + 1


def words(value: str) -> list[tuple[str, bool]]:
    """Split on whitespace honouring quotes and C escapes, as systemd does
    (``extract_first_word`` with unquoting and C unescaping).

    Each word comes with whether any part of it was quoted.
    """
    out: list[tuple[str, bool]] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in _SEPARATORS:
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quoted, quote = False, ""
        while i < n and (quote or value[i] not in _SEPARATORS):
            char = value[i]
            if char == "\\" and i + 1 < n:
                text, i = _unescape(value, i + 1)
                word.append(text)
            elif quote and char == quote:
                quote, i = "", i + 1
            elif not quote and char in "\"'":
                quote, quoted, i = char, True, i + 1
            else:
                word.append(char)
                i += 1
        if quote:
            raise UnitFileError(f"unbalanced quotes in {value!r}")
        out.append(("".join(word), quoted))
    return out


def split_command(value: str) -> list[str]:
    """``ExecStart=`` as argv, without systemd's prefixes (``-@:+!``), unexpanded."""
    stripped = value.lstrip("-@:+!")
    return [word for word, _ in words(stripped)]


def expand(value: str, env: Mapping[str, str], unit_name: str = "") -> list[str]:
    """``ExecStart=`` as systemd would run it with ``env``.

    ``${VAR}`` is replaced inside a word; a word that is exactly ``$VAR``
    (quoted or not) becomes the value split on whitespace; ``$VAR`` inside a
    longer word stays as written; ``$$`` is a literal ``$``; ``%n`` is the
    unit name and ``%%`` a literal ``%``. An undefined variable is empty.
    """
    argv: list[str] = []
    for word, _ in words(value.lstrip("-@:+!")):
        word = word.replace("%%", "\0pct").replace("%n", unit_name).replace("\0pct", "%")
        bare = _BARE_VAR.match(word)
        if bare:
            argv.extend(env.get(bare.group(1), "").split())
            continue
        word = word.replace("$$", "\0dollar")
        word = _VAR.sub(lambda m: env.get(m.group(1), ""), word)
        argv.append(word.replace("\0dollar", "$"))
    return argv


def environment(unit: UnitFile) -> dict[str, str]:
    """Every ``Environment=`` assignment of ``[Service]``, later ones winning."""
    env: dict[str, str] = {}
    for line in unit.values("Service", "Environment"):
        if not line:
            env.clear()  # an empty assignment resets the list, as in systemd
            continue
        for word, _ in words(line):
            key, sep, val = word.partition("=")
            if sep and key:
                env[key] = val
    return env


def environment_files(unit: UnitFile) -> list[tuple[str, bool]]:
    """``EnvironmentFile=`` paths, each with whether it is optional (a ``-`` prefix)."""
    return [
        (path.lstrip("-"), path.startswith("-"))
        for path in unit.values("Service", "EnvironmentFile")
        if path
    ]


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd reads an EnvironmentFile (``parse_env_file_internal``):
    comments, unquoted values with backslash escapes, single quotes literal, double
    quotes escaping only ``\\ " $ ` `` and spanning lines, backslash-newline joining."""
    env: dict[str, str] = {}
    state, key, value = "pre_key", "", ""
    for char in text + "\n":
        if state == "pre_key":
            if char in "#;":
                state = "comment"
            elif char not in _SEPARATORS:
                state, key = "key", char
        elif state == "comment":
            if char in "\n\r":
                state = "pre_key"
        elif state == "key":
            if char in "\n\r":
                state = "pre_key"  # a line without '=' is ignored
            elif char == "=":
                state, key, value = "pre_value", key.strip(), ""
            else:
                key += char
        elif state in ("pre_value", "value"):
            if char in "\n\r":
                env[key] = value.rstrip(_SEPARATORS) if state == "value" else value
                state = "pre_key"
            elif char == "'":
                state = "single"
            elif char == '"':
                state = "double"
            elif char == "\\":
                state = "value_escape"
            elif state == "value" or char not in _SEPARATORS:
                state, value = "value", value + char
        elif state == "value_escape":
            state = "value"
            value += "" if char in "\n\r" else char
        elif state == "single":
            if char == "'":
                state = "pre_value"
            else:
                value += char
        elif state == "double":
            if char == '"':
                state = "pre_value"
            elif char == "\\":
                state = "double_escape"
            else:
                value += char
        elif state == "double_escape":
            state = "double"
            if char in '"\\`$':
                value += char
            elif char != "\n":
                value += "\\" + char
    return env


def quote_env_value(value: str) -> str:
    """A value written so :func:`parse_env_file` (and systemd) read it back unchanged:
    single-quoted (literal to the next quote, newlines included) unless it holds one."""
    if "'" not in value:
        return f"'{value}'"
    return '"' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


def render_env_file(env: Mapping[str, str]) -> str:
    return "".join(f"{key}={quote_env_value(value)}\n" for key, value in sorted(env.items()))


def parse_timespan(value: str) -> float | None:
    """systemd time spans (``90``, ``30s``, ``1min 30s``, ``500ms``); None for infinity."""
    text = value.strip()
    if text == "infinity":
        return None
    total, pos = 0.0, 0
    for match in _SPAN.finditer(text):
        if match.start() != pos or not match.group(0):
            break
        total += float(match.group(1)) * _SPAN_UNITS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise UnitFileError(f"invalid time span {value!r}")
    return total


@dataclass(frozen=True)
class KeyRule:
    """How often the unit template writes one key: ``least`` to ``most`` times (None: any)."""

    least: int
    most: int | None


def _key_rules(source: str) -> dict[tuple[str, str], KeyRule]:
    """(section, key) → rule, read from the template's own text.

    A key outside any ``{% if %}``/``{% for %}`` is always written; one inside
    an ``if`` may be left out; one inside a ``for`` may repeat.
    """
    blocks: list[str] = []
    section = ""
    always: Counter[tuple[str, str]] = Counter()
    sometimes: Counter[tuple[str, str]] = Counter()
    repeated: set[tuple[str, str]] = set()
    for line in source.splitlines():
        tag = re.match(r"\{%-?\s*(\w+)", line)
        if tag:
            word = tag.group(1)
            if word in ("if", "for"):
                blocks.append(word)
            elif word.startswith("end"):
                blocks.pop()
            continue
        header = re.match(r"^\[(\w+)\]$", line)
        if header:
            section = header.group(1)
            continue
        key = re.match(r"^([A-Za-z][A-Za-z0-9-]*)=", line)
        if key:
            pair = (section, key.group(1))
            (sometimes if blocks else always)[pair] += 1
            if "for" in blocks:
                repeated.add(pair)
    return {
        pair: KeyRule(always[pair], None if pair in repeated else always[pair] + sometimes[pair])
        for pair in {*always, *sometimes}
    }


def shape_problems(assignments: Iterable[tuple[str, str]]) -> list[str]:
    """What is wrong with a unit's (section, key) pairs, compared with what the template
    writes: an unknown section or key, a key missing, or written too often. Empty: the
    unit has exactly the template's shape."""
    seen = Counter(assignments)
    problems = [f"[{section}] {key}= is not a key llmgw writes"
                for section, key in sorted(seen) if (section, key) not in KEYS]
    for (section, key), rule in sorted(KEYS.items()):
        count = seen[(section, key)]
        if count < rule.least:
            problems.append(f"[{section}] has no {key}=")
        elif rule.most is not None and count > rule.most:
            problems.append(f"[{section}] {key}= is written {count} times; llmgw writes it "
                            f"at most {rule.most}")
    return problems


# Every key llmgw's unit template writes, read from the template shipped with llmgw
# (the agent does not render; it checks what it is sent against the same source).
KEYS = _key_rules(resources.files("llmgw").joinpath("templates/unit.service.j2").read_text())
