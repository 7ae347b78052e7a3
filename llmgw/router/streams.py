"""Server-sent events: asking engines for usage, and relaying streams event by event.

Token accounting for a stream needs the engine's final usage chunk, which
OpenAI-compatible engines send only when the request says
``stream_options: {include_usage: true}``. :func:`ask_for_usage` adds that
when the client did not, and :class:`Relay` then removes the extra chunk from
what the client sees, so a client gets exactly the stream it asked for: one
that asked for usage gets the chunk untouched; one that did not never sees a
chunk with empty ``choices`` it was not written to expect.

The relay forwards every complete event as soon as it has arrived; only an
event cut in two by the network waits for its end (a client cannot use half an
event anyway). Only events that mention ``"usage"`` are decoded. It also counts
the events it relays (what a client that hangs up is charged for) and notes
whether the stream's last event came (``finished``): a stream that ends without
it was cut short.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmgw.router import usages

_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'
_EVENT = re.compile(rb"(.*?)(\r?\n\r?\n)", re.DOTALL)
_USAGE = b'"usage"'
_DATA = b"data:"
# The last event of a whole stream: chat and completions end with [DONE], responses
# with a terminal response.* event. Anchored so the same words inside generated text
# (escaped, or not at a line's start) do not count.
_LAST_EVENT = re.compile(
    rb'^data: ?\[DONE\]\r?$|"type": ?"response\.(?:completed|incomplete|failed)"', re.MULTILINE
)


def ask_for_usage(body: bytes, payload: dict[str, Any]) -> tuple[bytes, bool]:
    """The body to send upstream, and whether the client itself asked for usage."""
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body, True
    if "stream_options" not in payload:
        stripped = body.lstrip()
        if stripped[:1] == b"{":
            # Splice instead of re-encoding: a long prompt is not serialised twice.
            # The key is absent, so adding it first cannot create a duplicate.
            return b"{" + _INCLUDE_USAGE + stripped[1:], False
    if options is not None and not isinstance(options, dict):
        return body, True  # malformed: let the engine say what is wrong with it
    merged = dict(payload)
    merged["stream_options"] = {**(options or {}), "include_usage": True}
    return json.dumps(merged).encode(), False


def _boundary(data: bytes, end: int | None = None) -> int:
    """End of the last complete event in ``data[:end]`` (after its blank line), or -1."""
    lf = data.rfind(b"\n\n", 0, end)
    crlf = data.rfind(b"\r\n\r\n", 0, end)
    return max(lf + 2 if lf >= 0 else -1, crlf + 4 if crlf >= 0 else -1)


def _event_data(event: bytes) -> Any:
    lines = [
        line[5:].removeprefix(b" ")
        for line in event.splitlines()
        if line.startswith(b"data:")
    ]
    if not lines:
        return None
    try:
        return json.loads(b"\n".join(lines))
    except (ValueError, RecursionError):
        return None


class Relay:
    """Splits a stream into events, keeps the last usage seen, drops the injected chunk."""

    def __init__(self, strip_usage_chunk: bool) -> None:
        self.strip = strip_usage_chunk
        self.usage: usages.Usage | None = None
        self.events = 0  # data events passed on
        self.finished = False  # the stream's last event arrived
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What to send the client now for ``chunk`` (possibly nothing yet).

        Called for every read of a stream, so it does the least it can: an engine
        writes whole events, so a chunk that ends with a blank line is passed on as it
        is, with no search for where its last event ends.
        """
        if self._pending:
            chunk, self._pending = self._pending + chunk, b""
        if not chunk.endswith(b"\n\n"):  # also the end of "\r\n\r\n"
            end = _boundary(chunk)
            if end < 0:
                self._pending = chunk
                return b""
            chunk, self._pending = chunk[:end], chunk[end:]
        return self._pass(chunk)

    def finish(self) -> bytes:
        """The remainder when the upstream ended without a final blank line."""
        rest, self._pending = self._pending, b""
        if not rest:
            return rest
        return self._pass(rest + b"\n\n" if _USAGE in rest else rest)

    def _pass(self, complete: bytes) -> bytes:
        if _USAGE in complete:
            complete = self._inspect(complete)
        self.events += complete.count(_DATA)
        if not self.finished:
            done, response = complete.find(b"[DONE]"), complete.find(b'"response.')
            first = min(i for i in (done, response, len(complete)) if i >= 0)
            if first < len(complete):
                # A match starts on the line of the first of those words, not before:
                # scanning from there, not from the chunk's start, is most of the saving.
                start = complete.rfind(b"\n", 0, first) + 1
                self.finished = _LAST_EVENT.search(complete, start) is not None
        return complete

    def _inspect(self, events: bytes) -> bytes:
        """``events`` less the injected usage chunk; keeps the usage it reports.

        Only the events from the first one that mentions usage on are split and
        decoded: when a slow client lets many events pile up, the usage chunk comes
        last, behind content events that need no look.
        """
        start = max(_boundary(events, events.find(_USAGE)), 0)
        kept: list[bytes] = [events[:start]]
        for match in _EVENT.finditer(events, start):
            event = match.group(1)
            if _USAGE in event:
                doc = _event_data(event)
                usage = usages.from_mapping(doc)
                if usage is not None:
                    self.usage = usage
                    if self.strip and isinstance(doc, dict) and doc.get("choices") == []:
                        continue
            kept.append(match.group(0))
        return b"".join(kept)
