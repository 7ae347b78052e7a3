"""Token counts from engine answers, read as cheaply as the format allows.

Engines put ``usage`` last in an OpenAI-shaped body (vLLM, SGLang, OpenAI
itself), so :func:`from_body` first looks only at the tail after the last
``"usage"`` key and decodes just that object; only when the tail does not
prove it is the top-level key (llama.cpp adds ``timings`` after it) does it
parse the whole body. An embeddings answer of a few megabytes of floats is
thus never decoded in full on the common path.

Both naming schemes are read: ``prompt_tokens``/``completion_tokens`` (chat,
completions, embeddings) and ``input_tokens``/``output_tokens`` (responses).
"""

from __future__ import annotations

import json
import re
from typing import Any

Usage = tuple[int | None, int | None]  # (prompt tokens, completion tokens)

_DECODER = json.JSONDecoder()
_COLON = re.compile(r"\s*:\s*")
_KEY = b'"usage"'


def from_mapping(doc: Any) -> Usage | None:
    """Usage from a decoded answer or stream event (``usage`` or ``response.usage``)."""
    if not isinstance(doc, dict):
        return None
    usage = doc.get("usage")
    if usage is None and isinstance(doc.get("response"), dict):
        usage = doc["response"].get("usage")
    return _counts(usage)


def _counts(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    prompt = prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None
    completion = (
        completion if isinstance(completion, int) and not isinstance(completion, bool) else None
    )
    if prompt is None and completion is None:
        return None
    return prompt, completion


def from_body(body: bytes) -> Usage | None:
    """Usage from a whole (non-streaming) JSON answer; None when it has none."""
    at = body.rfind(_KEY)
    if at < 0:
        return None
    if at == 0 or body[at - 1] != 0x5C:  # a backslash would make it text inside a string
        try:
            tail = body[at + len(_KEY) :].decode()
            colon = _COLON.match(tail)
            if colon:
                value, end = _DECODER.raw_decode(tail, colon.end())
                # `"usage": {...}` followed only by the closing brace of the document
                # is the top-level key: a nested one would need more closing brackets.
                if tail[end:].strip() == "}":
                    return _counts(value)
        except (UnicodeDecodeError, ValueError, RecursionError):
            pass
    try:
        return from_mapping(json.loads(body))
    except (ValueError, RecursionError):
        return None
