"""Requests for a LoRA adapter, rewritten the way the base model's engine selects one.

A client names an adapter as its model (``"model": "sql-expert"``). The router
sends it to the replicas of the base model (every one loads every adapter of
its model, :mod:`llmgw.engines`), and the body says which adapter:

* **vLLM** serves each ``--lora-modules`` name as a model: the body goes as it is.
* **SGLang** takes ``base:adapter`` in ``model`` (its OpenAI-compatible form).
* **llama.cpp** serves one model name; an adapter loaded with
  ``--lora-init-without-apply`` applies to a request that lists it in ``lora``
  (``[{"id": i, "scale": s}]``, ``i`` its place in ``--lora-scaled``), and to no
  other. So ``model`` becomes the base's name and ``lora`` names the adapter.
  A request for the base model that brings its own ``lora`` is refused: it would
  get an adapter at the base model's price.

A purely computational module with no side effects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmgw.router.errors import ApiError


@dataclass(frozen=True)
class AdapterRoute:
    """How a request for one adapter reaches its base model's engines."""

    parent: str  # the base model's served name
    engine: str  # "vllm" | "sglang" | "llama.cpp"
    index: int  # its place among the model's adapters (llama.cpp's adapter id)
    scale: float = 1.0


def rewrite(body: bytes, payload: dict[str, Any], route: AdapterRoute | None,
            selects_per_request: bool = False) -> tuple[bytes, dict[str, Any]]:
    """The body and payload to send for a request to ``route`` (None: the base model).

    ``selects_per_request``: the base model's engine selects adapters from the body
    (llama.cpp with adapters), so a base request must not carry ``lora`` itself.
    Raises :class:`ApiError` (400) for such a request.
    """
    if route is None:
        if selects_per_request and "lora" in payload:
            raise ApiError(400, "lora is chosen by the model's name here: name the adapter as "
                           "the model (GET /v1/models lists them)", code="invalid_value",
                           param="lora")
        return body, payload
    if route.engine == "vllm":
        return body, payload
    if route.engine == "sglang":
        changed = {**payload, "model": f"{route.parent}:{payload['model']}"}
    else:
        changed = {**payload, "model": route.parent,
                   "lora": [{"id": route.index, "scale": route.scale}]}
    return json.dumps(changed).encode(), changed
