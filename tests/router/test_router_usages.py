"""Reading token usage cheaply, and relaying SSE events whole, without losing any."""

from __future__ import annotations

import json

import pytest

from llmgw.router import streams, usages

USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


@pytest.mark.parametrize("doc, expected", [
    pytest.param({"id": "x", "choices": [], "usage": USAGE}, (7, 3), id="vllm: usage last"),
    pytest.param({"choices": [], "usage": USAGE, "id": "x", "timings": {"usage": 1}}, (7, 3),
                 id="llama.cpp: keys after usage"),
    pytest.param({"choices": [{"message": {"content": '"usage": {"prompt_tokens": 99}'}}],
                  "usage": USAGE}, (7, 3), id="usage-like text in the answer"),
    pytest.param({"usage": USAGE, "choices": [{"metadata": {"usage": {"prompt_tokens": 99}}}]},
                 (7, 3), id="nested usage after the real one"),
    pytest.param({"data": [], "usage": {"prompt_tokens": 4, "total_tokens": 4}}, (4, None),
                 id="embeddings"),
    pytest.param({"output": [], "usage": {"input_tokens": 5, "output_tokens": 2}}, (5, 2),
                 id="responses"),
    pytest.param({"choices": [], "usage": None}, None, id="null"),
    pytest.param({"choices": []}, None, id="absent"),
])
@pytest.mark.parametrize("indent", [None, 2])
def test_usage_from_body(doc: dict[str, object], expected: object, indent: int | None) -> None:
    assert usages.from_body(json.dumps(doc, indent=indent).encode()) == expected


def test_usage_from_garbage() -> None:
    assert usages.from_body(b'not json "usage": {') is None
    assert usages.from_body(b"") is None


@pytest.mark.parametrize("payload, sent_options, asked", [
    ({"model": "m", "stream": True}, {"include_usage": True}, False),
    ({"model": "m", "stream": True, "stream_options": {"include_usage": True}},
     {"include_usage": True}, True),
    ({"model": "m", "stream": True, "stream_options": {"include_usage": False}},
     {"include_usage": True}, False),
    ({"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": True}},
     {"continuous_usage_stats": True, "include_usage": True}, False),
    ({"model": "m", "stream": True, "stream_options": None}, {"include_usage": True}, False),
])
def test_ask_for_usage(payload: dict[str, object], sent_options: object, asked: bool) -> None:
    body, client_asked = streams.ask_for_usage(json.dumps(payload).encode(), payload)
    sent = json.loads(body)
    assert sent["stream_options"] == sent_options and client_asked == asked
    assert {k: v for k, v in sent.items() if k != "stream_options"} == {
        k: v for k, v in payload.items() if k != "stream_options"}


def sse(doc: object) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


CHUNK = sse({"choices": [{"delta": {"content": "hi"}}]})
USAGE_CHUNK = sse({"choices": [], "usage": USAGE})
STREAM = CHUNK + CHUNK + USAGE_CHUNK + b"data: [DONE]\n\n"


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
@pytest.mark.parametrize("strip", [True, False])
def test_relay_any_split(size: int, strip: bool) -> None:
    relay = streams.Relay(strip_usage_chunk=strip)
    out = b""
    for at in range(0, len(STREAM), size):
        piece = relay.feed(STREAM[at : at + size])
        # Only whole events go out: a client never gets half of one.
        assert piece == b"" or piece.endswith(b"\n\n")
        out += piece
    out += relay.finish()
    assert relay.usage == (7, 3)
    assert out == (STREAM.replace(USAGE_CHUNK, b"") if strip else STREAM)


def test_relay_crlf_and_unterminated_tail() -> None:
    stream = CHUNK.replace(b"\n", b"\r\n") + b'data: {"choices": [], "usage": ' + json.dumps(
        USAGE).encode() + b"}"
    relay = streams.Relay(strip_usage_chunk=True)
    out = relay.feed(stream) + relay.finish()
    assert out == CHUNK.replace(b"\n", b"\r\n") and relay.usage == (7, 3)


def test_relay_keeps_a_usage_chunk_that_carries_content() -> None:
    both = sse({"choices": [{"delta": {"content": "!"}}], "usage": USAGE})
    relay = streams.Relay(strip_usage_chunk=True)
    assert relay.feed(both) == both and relay.usage == (7, 3)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_relay_a_backlog_ending_in_the_usage_chunk(newline: bytes) -> None:
    # A slow client lets events pile up: one read holds many content events and then the
    # usage chunk. Only the usage chunk goes; the events before it pass byte for byte.
    content = b"".join(sse({"choices": [{"delta": {"content": f"w{i}"}}]}) for i in range(50))
    stream = (content + USAGE_CHUNK + b"data: [DONE]\n\n").replace(b"\n", newline)
    relay = streams.Relay(strip_usage_chunk=True)
    out = relay.feed(stream) + relay.finish()
    assert out == (content + b"data: [DONE]\n\n").replace(b"\n", newline)
    assert relay.usage == (7, 3) and relay.events == 51 and relay.finished
