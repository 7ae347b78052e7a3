"""Prefix affinity: which requests should land on the same replica, and where.

An engine keeps the KV cache of the prompts it evaluated (llama.cpp's slots
and prompt cache, vLLM's and SGLang's prefix caches). Requests that share a
long prompt prefix — one system prompt, one conversation growing turn by
turn — are cheaper on the replica that saw the prefix before: it evaluates
only the new tail. Least-outstanding balancing scatters them.

* :func:`key` turns a request body into a digest of its *context* — every
  message but the last, which is the new question (a completion's whole
  prompt) — cut to its first ``prefix_chars`` characters; None when the
  context is shorter than ``min_chars``, too little to be worth a preference.
  So users sharing a system prompt share a key whatever they ask, and a
  conversation keeps its key once its history is longer than ``prefix_chars``.
* :class:`Ring` is consistent hashing with bounded loads (Mirrokni, Thorup
  and Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018):
  each replica sits at many points of a hash ring; a key goes to the first
  replica clockwise whose outstanding requests stay under
  ``ceil(load_factor × (total + 1) / replicas)``. The same key keeps its
  replica while that replica is not overloaded; a hot prefix spills to the
  next replica on the ring, never piles onto one; adding or removing a
  replica moves only the keys next to it.

A purely computational module: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")

POINTS_PER_REPLICA = 64  # virtual nodes: enough that two replicas split keys evenly
_SEPARATOR = "\x1e"  # between messages: "user: ab" + "c" must not equal "user: a" + "bc"


def prompt_text(body: Mapping[str, Any], *, context: bool = False) -> str:
    """The prompt a request asks the engine to evaluate, as one string, in order.

    Chat messages give ``role: text`` each (text parts of multi-part content
    included); completions give ``prompt``; responses give ``instructions``
    and ``input``. Anything else contributes nothing. With ``context``, the
    last of several parts (the new question) is left out.
    """
    parts = _parts(body)
    if context and len(parts) > 1:
        parts = parts[:-1]
    return _SEPARATOR.join(parts)


def _parts(body: Mapping[str, Any]) -> list[str]:
    parts: list[str] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, Mapping):
                parts.append(f"{message.get('role', '')}: {_text(message.get('content'))}")
    for field in ("instructions", "prompt", "input"):
        value = body.get(field)
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            parts.extend(f"{v.get('role', '')}: {_text(v.get('content'))}" for v in value)
        elif value is not None:
            parts.append(_text(value))
    return parts


def key(body: Mapping[str, Any], prefix_chars: int, min_chars: int) -> str | None:
    """A digest of the request's context prefix; None when the context is too short."""
    text = prompt_text(body, context=True)
    if len(text) < min_chars:
        return None
    return hashlib.blake2b(text[:prefix_chars].encode(), digest_size=8).hexdigest()


class Ring(Generic[T]):
    """Consistent hashing with bounded loads over ``members``, named by ``name(member)``."""

    def __init__(self, members: Sequence[T], name: Callable[[T], str]) -> None:
        points = []
        for member in members:
            label = name(member)
            for index in range(POINTS_PER_REPLICA):
                points.append((_position(f"{label}#{index}"), label, member))
        points.sort(key=lambda point: (point[0], point[1]))
        self._positions = [point[0] for point in points]
        self._members = [point[2] for point in points]
        self.size = len(members)

    def pick(
        self, digest: str, load: Callable[[T], int], load_factor: float,
        allowed: Callable[[T], bool] = lambda _member: True,
    ) -> T | None:
        """The first allowed member clockwise from ``digest`` that is under the load bound.

        The bound is ``ceil(load_factor × (total + 1) / members)`` over the
        allowed members, so some member always fits; None only when none is allowed.
        """
        if not self._members:
            return None
        candidates = {id(m): m for m in self._members if allowed(m)}
        if not candidates:
            return None
        total = sum(load(m) for m in candidates.values())
        bound = math.ceil(load_factor * (total + 1) / len(candidates))
        start = bisect.bisect_left(self._positions, _position(digest))
        count = len(self._members)
        for step in range(count):
            member = self._members[(start + step) % count]
            if id(member) in candidates and load(member) < bound:
                return member
        return None  # unreachable: the least loaded allowed member is under the bound


def _position(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text", ""), str)
        )
    return "" if content is None else str(content)
