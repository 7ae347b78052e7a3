"""The streaming relay's HTTP/1.1 reader: heads and chunked bodies, read strictly."""

from __future__ import annotations

import pytest

from llmgw.router import framings
from llmgw.router.framings import Dechunker, FramingError, parse_head

SECRET = b"sk-prompt-secret"
EVENTS = [
    b'data: {"choices":[{"delta":{"content":"' + SECRET + b'"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n',
    b"data: [DONE]\n\n",
]
PAYLOAD = b"".join(EVENTS)
BODY = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"


def decode(*pieces: bytes) -> tuple[bytes, Dechunker]:
    dechunker = Dechunker()
    out = b"".join(dechunker.feed(piece) for piece in pieces)
    if dechunker.error is not None:
        raise dechunker.error
    return out, dechunker


def test_a_body_split_at_every_byte_offset_decodes_to_the_same_payload() -> None:
    for cut in range(len(BODY) + 1):
        out, dechunker = decode(BODY[:cut], BODY[cut:])
        assert out == PAYLOAD, cut
        assert dechunker.done and dechunker.extra == b"", cut


def test_a_body_fed_one_byte_at_a_time_passes_data_on_as_it_arrives() -> None:
    dechunker = Dechunker()
    out = []
    for i in range(len(BODY)):
        out.append(dechunker.feed(BODY[i:i + 1]))
        assert dechunker.done == (i == len(BODY) - 1)
    assert b"".join(out) == PAYLOAD
    # A chunk's data is handed on byte by byte, never held until the chunk is whole.
    assert sum(1 for piece in out if piece) == len(PAYLOAD)


def test_a_truncated_body_is_not_done() -> None:
    for cut in range(len(BODY)):
        out, dechunker = decode(BODY[:cut])
        assert not dechunker.done, cut
        assert PAYLOAD.startswith(out), cut


def test_extensions_trailers_and_bytes_after_the_body() -> None:
    body = b"5;name=value\r\nhello\r\n0\r\nX-Checksum: 1\r\n\r\nHTTP/1.1"
    out, dechunker = decode(body)
    assert (out, dechunker.done, dechunker.extra) == (b"hello", True, b"HTTP/1.1")
    assert decode(b"A\r\n0123456789\r\n0\r\n\r\n")[0] == b"0123456789"  # upper-case hex


@pytest.mark.parametrize("line", [
    b"-5", b"+5", b"0x5", b" 5", b"5 ", b"", b"g", b"5_0", b"123456789",
    b"5;\r", b"\xff", b"5\n",
])
def test_hostile_chunk_size_lines_are_refused(line: bytes) -> None:
    with pytest.raises(FramingError, match="chunk-size line"):
        decode(line + b"\r\nhello\r\n0\r\n\r\n")


def test_a_bare_lf_after_a_size_is_refused() -> None:
    with pytest.raises(FramingError):
        decode(b"5\nhello\r\n0\r\n\r\n")


def test_chunk_data_must_end_with_crlf() -> None:
    with pytest.raises(FramingError, match="CRLF"):
        decode(b"5\r\nhelloX\r\n0\r\n\r\n")
    with pytest.raises(FramingError, match="CRLF"):
        decode(b"5\r\nhello", b"\n0\r\n\r\n")
    with pytest.raises(FramingError, match="CRLF"):
        decode(b"5\r\nhello\r", b"X")


def test_a_chunk_over_the_bound_is_refused_before_its_data() -> None:
    with pytest.raises(FramingError, match="chunk larger"):
        decode(b"%x\r\n" % (framings.MAX_CHUNK + 1))
    out, _ = decode(b"%x\r\n" % framings.MAX_CHUNK + b"abc")
    assert out == b"abc"


def test_an_oversize_chunk_line_is_refused_even_fed_byte_by_byte() -> None:
    line = b"1;" + b"x" * framings.MAX_CHUNK_LINE
    dechunker = Dechunker()
    for i in range(len(line)):
        if dechunker.error is None:
            dechunker.feed(line[i:i + 1])
    assert dechunker.error is not None and "longer than" in str(dechunker.error)
    with pytest.raises(FramingError, match="longer than"):
        decode(b"1;" + b"x" * (framings.MAX_CHUNK_LINE + 10))
    # Just within the bound is fine.
    ok = b"1;" + b"x" * (framings.MAX_CHUNK_LINE - 2)
    assert decode(ok + b"\r\nA\r\n")[0] == b"A"


def test_oversize_trailers_are_refused() -> None:
    trailer = b"X-T: " + b"y" * framings.MAX_TRAILERS
    with pytest.raises(FramingError, match="trailers"):
        decode(b"0\r\n" + trailer)


def test_the_payload_before_an_error_is_returned_and_the_error_kept() -> None:
    dechunker = Dechunker()
    assert dechunker.feed(b"5\r\nhello\r\nzz\r\nworld") == b"hello"
    assert dechunker.error is not None and not dechunker.done
    with pytest.raises(FramingError):
        dechunker.feed(b"\r\n")


def test_errors_never_quote_the_bytes() -> None:
    for bad in (SECRET + b"\r\n", b"5\r\n" + SECRET, b"0\r\n" + SECRET * 2000):
        try:
            decode(bad)
        except FramingError as exc:
            assert SECRET.decode() not in str(exc)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_head_split_anywhere_is_read_once_whole() -> None:
    for cut in range(len(HEAD)):
        assert parse_head(HEAD[:cut]) is None
    parsed = parse_head(HEAD + b"5\r\n")
    assert parsed is not None
    head, start = parsed
    assert (head.status, head.body, head.keep_alive, start) == (200, "chunked", True, len(HEAD))
    assert head.headers["content-type"] == "text/event-stream"


@pytest.mark.parametrize(("head", "body", "length", "keep_alive"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", "length", 12, True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12, 12\r\n\r\n", "length", 12, True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", "close", 0, False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", "length", 2, False),
    (b"HTTP/1.1 204 No Content\r\n\r\n", "empty", 0, True),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n",
     "length", 1, True),
    (b"HTTP/1.1 500\r\ntransfer-encoding: Chunked\r\n\r\n", "chunked", 0, True),
])
def test_how_a_body_ends(head: bytes, body: str, length: int, keep_alive: bool) -> None:
    parsed = parse_head(head)
    assert parsed is not None
    assert (parsed[0].body, parsed[0].length, parsed[0].keep_alive) == (body, length, keep_alive)


@pytest.mark.parametrize(("head", "rule"), [
    (b"HTTP/2 200 OK", "status line"),
    (b"HTTP/1.1 20 OK", "status line"),
    (b"ICY 200 OK", "status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Type : text/plain", "header line"),
    (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded", "header line"),
    (b"HTTP/1.1 200 OK\r\nX-A: a\x00b", "header line"),
    (b"HTTP/1.1 200 OK\r\nNo colon", "header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -3", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked", "both"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked", "transfer coding"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * (framings.MAX_HEADERS + 1) + b"X: 1",
     "header lines"),
])
def test_hostile_heads_are_refused(head: bytes, rule: str) -> None:
    with pytest.raises(FramingError, match=rule):
        parse_head(head + b"\r\n\r\n")


def test_a_head_without_end_is_refused_at_its_bound() -> None:
    endless = b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * framings.MAX_HEAD
    with pytest.raises(FramingError, match="longer than"):
        parse_head(endless)
    assert parse_head(endless[: framings.MAX_HEAD - 1]) is None


@pytest.mark.parametrize("read", [
    b"+5\r\nhello\r\n", b" 5\r\nhello\r\n", b"0x5\r\nhello\r\n", b"5\r\nhelloXY",
    b"5\r\nhello\n\n", b"-0\r\n\r\n",
])
def test_a_read_of_one_hostile_chunk_is_refused(read: bytes) -> None:
    """The one-whole-chunk read (the usual one) takes a shortcut; it is as strict."""
    with pytest.raises(FramingError):
        decode(read)
    assert decode(b"5\r\nhello\r\n")[0] == b"hello"
