"""Requests for a LoRA adapter, rewritten the way the base model's engine selects one.

A client names an adapter as its model (``"model": "sql-expert"``). The router
sends it to the replicas of the base model (every one loads every adapter of
its model, :mod:`llmgw.engines`), and the body says which adapter:

* **vLLM** serves each ``--lora-modules`` name as a model: the body goes as it is.
* **SGLang** takes ``base:adapter`` in ``model`` (its OpenAI-compatible form).
* **llama.cpp** serves one model name and applies the adapters a request lists in
  ``lora`` (``[{"id": i, "scale": s}]``, ``i`` the adapter's place in
  ``--lora-scaled``), or, when it lists none, every adapter at its start-up scale.
  So every request to such a model lists every adapter: ``model`` becomes the
  base's name, the adapter asked for gets its scale and the others 0; a request
  for the base model gets 0 for each. A request for the base model that brings
  its own ``lora`` is refused: it would get an adapter at the base model's price.

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
    count: int = 1  # how many adapters the model has


def rewrite(body: bytes, payload: dict[str, Any], route: AdapterRoute | None,
            listed: int = 0) -> tuple[bytes, dict[str, Any]]:
    """The body and payload to send for a request to ``route`` (None: the base model).

    ``listed``: how many adapters the base model's engine applies unless a request
    lists them (llama.cpp's; 0 elsewhere). Raises :class:`ApiError` (400) for a
    request to such a base model that lists adapters itself.
    """
    if route is None:
        if not listed:
            return body, payload
        if "lora" in payload:
            raise ApiError(400, "lora is chosen by the model's name here: name the adapter as "
                           "the model (GET /v1/models lists them)", code="invalid_value",
                           param="lora")
        changed = {**payload, "lora": [{"id": i, "scale": 0.0} for i in range(listed)]}
    elif route.engine == "vllm":
        return body, payload
    elif route.engine == "sglang":
        changed = {**payload, "model": f"{route.parent}:{payload['model']}"}
    else:
        changed = {**payload, "model": route.parent,
                   "lora": [{"id": i, "scale": route.scale if i == route.index else 0.0}
                            for i in range(route.count)]}
    return json.dumps(changed).encode(), changed
