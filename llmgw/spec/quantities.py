"""Durations (``30m``) and sizes (``24GiB``) as they are written in cluster files.

Both parse into plain numbers (seconds, bytes) so the rest of llmgw never
sees a string unit again. Errors say what was given and what is accepted.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
}


def parse_duration(value: Any) -> float:
    """Seconds from ``90``, ``"45s"``, ``"30m"``, ``"1h30m"``, ``"500ms"``.

    >>> parse_duration("1h30m")
    5400.0
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, 5m, 1h30m; got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative; got {value}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like 30s, 5m, 1h30m; got {value!r}")
    text = value.strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError(
            f"invalid duration {value!r}: use a number with a unit (ms, s, m, h, d), "
            "for example 30s, 5m or 1h30m"
        )
    return total


def format_duration(seconds: float) -> str:
    """The shortest spelling of ``seconds`` that parses back to it: 1800 → ``30m``."""
    if seconds and seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts) or "0s"


def parse_size(value: Any) -> int:
    """Bytes from ``1024``, ``"24GiB"``, ``"512MB"``, ``"1.5TiB"``.

    >>> parse_size("24GiB")
    25769803776
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 24GiB or 512MB; got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a size cannot be negative; got {value}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a size like 24GiB or 512MB; got {value!r}")
    match = _SIZE.match(value)
    if not match:
        raise ValueError(
            f"invalid size {value!r}: use a number with a unit (B, KB, MB, GB, TB, "
            "KiB, MiB, GiB, TiB), for example 24GiB"
        )
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[(unit or "B").upper()])


def format_size(size: int) -> str:
    """Bytes in the largest binary unit that keeps it readable: ``24GiB``."""
    for unit in ("PiB", "TiB", "GiB", "MiB", "KiB"):
        scale = _SIZE_UNITS[unit.upper()]
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return f"{size}B"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d))+$"},
                {"type": "number", "minimum": 0},
            ],
            "description": "A duration: seconds, or a string like 30s, 5m, 1h30m.",
        }
    ),
]

Size = Annotated[
    int,
    BeforeValidator(parse_size),
    PlainSerializer(format_size, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([KMGTPkmgtp]i?[Bb]|[Bb])?\s*$"},
                {"type": "integer", "minimum": 0},
            ],
            "description": "A size: bytes, or a string like 24GiB, 512MB.",
        }
    ),
]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, in the singular for one: ``1 node``, ``2 nodes``, ``0 errors``.

    >>> count(1, "node"), count(3, "replica"), count(2, "GPU")
    ('1 node', '3 replicas', '2 GPUs')
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
