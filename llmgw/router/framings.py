"""HTTP/1.1 response framing, read strictly: an engine's status line, headers and chunks.

The streaming relay (:mod:`llmgw.router.upstreams`) reads an engine's socket
itself, so it parses what aiohttp's client parser would: :func:`parse_head`
reads the status line and headers, and says how the body ends (:class:`Head`:
chunked, a length, or the connection closing); :class:`Dechunker` decodes a
chunked body read by read and hands the payload on as it arrives — a chunk
cut by the network is passed on in pieces, never held until it is whole.

Strict and bounded, because an engine is software that can be wrong or hostile:
a head over :data:`MAX_HEAD` bytes or :data:`MAX_HEADERS` lines, a header line
that is not ``token: value`` (space before the colon, obs-fold), a status line
that is not ``HTTP/1.x NNN``, a transfer coding other than ``chunked``, both a
length and a coding, conflicting lengths; a chunk-size line that is not 1–8 hex
digits (with optional ``;extensions``) ended by CRLF, or longer than
:data:`MAX_CHUNK_LINE`; a chunk over :data:`MAX_CHUNK` bytes; chunk data not
followed by CRLF; trailers over :data:`MAX_TRAILERS` bytes — each raises
:class:`FramingError`, whose message names the rule broken and never quotes the
bytes (they may be a client's prompt or a model's answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
MAX_CHUNK_LINE = 1024
MAX_CHUNK = 16 * 1024 * 1024
MAX_TRAILERS = 16 * 1024

CHUNKED, LENGTH, CLOSE, EMPTY = "chunked", "length", "close", "empty"

_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9]{2})(?: [\t -~\x80-\xff]*)?")
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\t -~\x80-\xff]*?)[ \t]*")
_EXTENSION = re.compile(rb"([0-9A-Fa-f]{1,8})[ \t]*;[\t -~\x80-\xff]*")
_HEX = frozenset(b"0123456789abcdefABCDEF")


class FramingError(Exception):
    """The engine's bytes break HTTP/1.1's framing; the message names the rule, not the bytes."""


@dataclass(frozen=True)
class Head:
    """A response's status and headers (names lower-cased), and how its body ends."""

    status: int
    headers: dict[str, str]
    body: str  # CHUNKED, LENGTH (``length`` bytes), CLOSE (at EOF) or EMPTY
    length: int
    keep_alive: bool  # the connection may carry another request after this body


def parse_head(data: bytes) -> tuple[Head, int] | None:
    """The head at the start of ``data`` and where its body starts; None while incomplete.

    Interim 1xx responses before the final one are skipped.
    """
    start = 0
    while True:
        end = data.find(b"\r\n\r\n", start, start + MAX_HEAD)
        if end < 0:
            if len(data) - start >= MAX_HEAD:
                raise FramingError(f"response head longer than {MAX_HEAD} bytes")
            return None
        head = _head(data[start:end])
        start = end + 4
        if head.status >= 200 or head.status == 101:
            return head, start


def _head(block: bytes) -> Head:
    lines = block.split(b"\r\n")
    status = _STATUS.fullmatch(lines[0])
    if status is None:
        raise FramingError("malformed status line")
    if len(lines) - 1 > MAX_HEADERS:
        raise FramingError(f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    lengths: set[str] = set()
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            raise FramingError("malformed header line (obs-fold, space before the colon, "
                               "or a control character)")
        name, value = field.group(1).decode().lower(), field.group(2).decode("latin-1")
        if name == "content-length":
            lengths.update(v.strip() for v in value.split(","))
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    code = int(status.group(2))
    keep_alive = status.group(1) == b"1" and "close" not in headers.get(
        "connection", "").lower()
    coding = headers.get("transfer-encoding")
    if code < 200 or code in (204, 304):
        return Head(code, headers, EMPTY, 0, keep_alive)
    if coding is not None:
        if lengths:
            raise FramingError("both Content-Length and Transfer-Encoding")
        if coding.strip().lower() != "chunked":
            raise FramingError("unsupported transfer coding (only chunked is read)")
        return Head(code, headers, CHUNKED, 0, keep_alive)
    if lengths:
        if len(lengths) != 1 or not (value := lengths.pop()).isdigit() or not value.isascii():
            raise FramingError("invalid or conflicting Content-Length")
        return Head(code, headers, LENGTH, int(value), keep_alive)
    return Head(code, headers, CLOSE, 0, False)


_SIZE, _DATA, _DATA_END, _TRAILERS, _DONE = range(5)


class Dechunker:
    """Decodes a chunked body read by read: :meth:`feed` returns the payload that arrived.

    ``done`` turns true after the last chunk and its trailers; ``extra`` is what
    came after that (nothing, on a connection that may be reused).
    """

    __slots__ = ("_state", "_left", "_rest", "_trailers", "extra", "error")

    def __init__(self) -> None:
        self._state = _SIZE
        self._left = 0  # bytes of the current chunk's data still to come
        self._rest = b""  # an incomplete size line, CRLF or trailer line
        self._trailers = 0
        self.extra = b""
        self.error: FramingError | None = None

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> bytes:
        """The payload in ``data`` (possibly b"").

        On a framing error, the payload decoded before it is returned and the error
        is kept in ``error``; any later feed raises it.
        """
        if self.error is not None:
            raise self.error
        if self._state == _SIZE and not self._rest:
            # The usual read: exactly one whole chunk (an engine writes an event a chunk).
            eol = data.find(b"\r\n", 0, 10)
            if eol > 0 and _HEX.issuperset(line := data[:eol]):
                stop = eol + 2 + int(line, 16)
                if stop + 2 == len(data) and stop > eol + 2 and data.endswith(b"\r\n") \
                        and stop - eol - 2 <= MAX_CHUNK:
                    return data[eol + 2:stop]
        out: list[bytes] = []
        try:
            self._decode(data, out)
        except FramingError as exc:
            self.error = exc
        return out[0] if len(out) == 1 else b"".join(out)

    def _decode(self, data: bytes, out: list[bytes]) -> None:
        if self._rest:
            data, self._rest = self._rest + data, b""
        state, left, pos, end = self._state, self._left, 0, len(data)
        while pos < end:
            if state == _DATA:
                stop = pos + left
                if stop > end:
                    out.append(data[pos:])
                    left -= end - pos
                    pos = end
                    break
                out.append(data[pos:stop])
                pos, left, state = stop, 0, _DATA_END
            if state == _DATA_END:
                if end - pos < 2:
                    if pos < end and data[pos] != 13:  # a lone CR may be followed by LF
                        raise FramingError("chunk data not followed by CRLF")
                    break
                if data[pos:pos + 2] != b"\r\n":
                    raise FramingError("chunk data not followed by CRLF")
                pos += 2
                state = _SIZE
            elif state == _SIZE:
                eol = data.find(b"\r\n", pos, pos + MAX_CHUNK_LINE + 2)
                if eol < 0:
                    if end - pos > MAX_CHUNK_LINE:
                        raise FramingError(f"chunk-size line longer than {MAX_CHUNK_LINE} bytes")
                    break
                line = data[pos:eol]
                pos = eol + 2
                if 0 < len(line) <= 8 and _HEX.issuperset(line):
                    left = int(line, 16)
                else:
                    extended = _EXTENSION.fullmatch(line)
                    if extended is None:
                        raise FramingError("malformed chunk-size line")
                    left = int(extended.group(1), 16)
                if left > MAX_CHUNK:
                    raise FramingError(f"chunk larger than {MAX_CHUNK} bytes")
                state = _DATA if left else _TRAILERS
            elif state == _TRAILERS:
                eol = data.find(b"\r\n", pos, pos + MAX_TRAILERS - self._trailers + 2)
                if eol < 0:
                    if self._trailers + end - pos > MAX_TRAILERS:
                        raise FramingError(f"trailers longer than {MAX_TRAILERS} bytes")
                    break
                self._trailers += eol + 2 - pos
                if eol == pos:
                    state = _DONE
                pos = eol + 2
            else:  # _DONE
                self.extra += data[pos:]
                pos = end
        if pos < end:
            self._rest = data[pos:]
        self._state, self._left = state, left
