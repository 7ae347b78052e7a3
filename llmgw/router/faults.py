"""Whose fault an engine's error answer is: the client's, or the server's.

Engines answer some requests they cannot serve with a 5xx although nothing is
wrong with the engine: llama-server says ``500 tools param requires --jinja
flag`` to a request with ``tools`` on a replica started without ``--jinja``;
vLLM says ``501 The model does not support Embeddings API``; SGLang wraps a
chat template's refusal (``Conversation roles must alternate ...``) as ``500
Internal server error: ...``. Counted as server errors, such answers page the
operator (``LlmgwHighErrorRate``), roll back a rollout that did nothing wrong
and are retried on another replica that will refuse them the same way.

:data:`KNOWN` is the table of the engine error bodies llmgw recognises, each
with its fault and a reason (a short label, the metric's ``reason``); the
bodies it was written from are recorded in ``tests/fixtures/engine-errors/``
(``SOURCES.md`` says where each came from). :func:`classify` is a purely
computational function with no side effects: an answer it does not recognise
is the server's fault (``reason="unclassified"``), as every 5xx was before.

Usage::

    fault = faults.classify(500, body)
    if fault.client:
        raise ApiError(400, fault.message, code=fault.reason)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["client", "server"]

MAX_MESSAGE = 500
"""Characters of an engine's message passed on to the client, at most."""
_MAX_SCAN = 64 * 1024  # bytes of a body looked at: a message is near the start


@dataclass(frozen=True)
class Known:
    """One recognised engine error: statuses, a pattern on its message, whose fault."""

    engines: str  # who answers this way, for the docs and SOURCES.md
    statuses: frozenset[int]
    pattern: re.Pattern[str]
    fault: Kind
    reason: str


@dataclass(frozen=True)
class Fault:
    """An engine's error answer, classified."""

    status: int  # the engine's status
    fault: Kind
    reason: str
    message: str  # the engine's message, escaped and bounded (see :func:`message_of`)

    @property
    def client(self) -> bool:
        return self.fault == "client"


def _known(engines: str, statuses: tuple[int, ...], pattern: str, fault: Kind,
           reason: str) -> Known:
    return Known(engines, frozenset(statuses), re.compile(pattern), fault, reason)


KNOWN: tuple[Known, ...] = (
    # llama.cpp: the request uses a feature this replica was not started with.
    _known("llama.cpp", (500,), r"^(tools|tool_choice) param requires --jinja flag",
           "client", "tools_need_jinja"),
    _known("llama.cpp", (500,), r"^image input is not supported", "client",
           "modality_unsupported"),
    _known("llama.cpp", (501,), r"^This server does not support embeddings", "client",
           "endpoint_unsupported"),
    # vLLM: an API the served model does not offer (NotImplementedError -> 501).
    _known("vLLM", (501,), r"^The model does not support [A-Za-z() ]+ API", "client",
           "endpoint_unsupported"),
    # SGLang: a request its chat template turned away, wrapped as a 500.
    _known("SGLang", (500,), r"^Internal server error: Conversation roles must alternate",
           "client", "chat_template_rejected"),
    # Server faults worth a name of their own: the engine is broken, not the request.
    _known("vLLM", (500,), r"^EngineCore encountered an issue", "server", "engine_dead"),
    _known("vLLM, SGLang", (500,), r"CUDA out of memory", "server", "out_of_memory"),
)


def classify(status: int, body: bytes, table: tuple[Known, ...] = KNOWN) -> Fault:
    """Whose fault the engine's ``status`` answer with ``body`` is (``status`` >= 500)."""
    text = _raw_message(body)
    for known in table:
        if status in known.statuses and known.pattern.search(text):
            return Fault(status, known.fault, known.reason, message_of(text))
    return Fault(status, "server", "unclassified", message_of(text))


def _raw_message(body: bytes) -> str:
    """The message in an engine's error body, unescaped: OpenAI's and vLLM's
    ``{"error": {"message"}}``, SGLang's ``{"message"}``, FastAPI's ``{"detail"}``;
    the body itself when it is not JSON."""
    data = body[:_MAX_SCAN]
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return data.decode("utf-8", "replace").strip()
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if isinstance(doc.get(key), str):
                return str(doc[key])
    return ""


def message_of(text: str) -> str:
    """``text`` fit to pass on: control characters escaped, at most :data:`MAX_MESSAGE`
    characters (an engine may echo a prompt into its message; a client gets the gist)."""
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode()
                      for c in text)
    if len(escaped) > MAX_MESSAGE:
        escaped = escaped[:MAX_MESSAGE - 1] + "…"
    return escaped
