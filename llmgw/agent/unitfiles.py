"""Rendered systemd units, read back: sections, labels, command line, environment.

Pure functions over text. The systemd backend only needs the labels (which
unit is which shard); the supervise backend runs the unit itself and so
needs what systemd would derive from it: ``ExecStart`` split and expanded
the way systemd does, ``Environment=`` assignments, ``EnvironmentFile=``
paths, the working directory and the stop timeout.

>>> split_command('/usr/bin/engine --name "two words" --port 18000')
['/usr/bin/engine', '--name', 'two words', '--port', '18000']
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

NAME = re.compile(r"^llmgw-[a-z0-9][a-z0-9._-]*-r\d+-s\d+\.service$")
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


def parse(name: str, text: str) -> UnitFile:
    """Sections and assignments of a unit file, in order, continuations joined."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
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
        current.append((key.strip(), value.strip()))
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


def words(value: str) -> list[tuple[str, bool]]:
    """Split on whitespace honouring quotes and backslash escapes, as systemd does.

    Each word comes with whether any part of it was quoted.
    """
    out: list[tuple[str, bool]] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i].isspace():
            i += 1
        if i >= n:
            break
        word, quoted = [], False
        while i < n and not value[i].isspace():
            char = value[i]
            if char in "\"'":
                quoted = True
                end = i + 1
                while end < n and value[end] != char:
                    if value[end] == "\\" and char == '"' and end + 1 < n:
                        end += 1
                    end += 1
                if end >= n:
                    raise UnitFileError(f"unbalanced quotes in {value!r}")
                inner = value[i + 1:end]
                word.append(re.sub(r"\\(.)", r"\1", inner) if char == '"' else inner)
                i = end + 1
            elif char == "\\" and i + 1 < n:
                word.append(value[i + 1])
                i += 2
            else:
                word.append(char)
                i += 1
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
    """``KEY=VALUE`` lines as systemd reads an EnvironmentFile (comments, quotes)."""
    env: dict[str, str] = {}
    for raw in _logical_lines(text):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = re.sub(r'\\(["\\`$\n])', r"\1", value)
        env[key] = value
    return env


def _logical_lines(text: str) -> list[str]:
    """Lines with double-quoted values that span several lines kept whole."""
    lines, current = [], ""
    for line in text.splitlines():
        current = f"{current}\n{line}" if current else line
        _, _, value = current.partition("=")
        value = value.lstrip()
        if value.startswith('"') and (len(value) == 1 or not _closes(value)):
            continue
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def _closes(value: str) -> bool:
    escaped = False
    for char in value[1:]:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return True
    return False


def quote_env_value(value: str) -> str:
    """A value written so :func:`parse_env_file` (and systemd) read it back unchanged."""
    if "'" not in value and "\n" not in value:
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
