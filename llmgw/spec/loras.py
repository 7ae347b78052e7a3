"""LoRA adapters: small weight deltas a model's engines load beside its weights.

A model's ``adapters:`` each get a name clients call like a model (``model:
sql-expert`` in a request), a ``source`` on the node, a ``scale`` and an
optional price. Every replica of the model loads every adapter at start-up
(the engines' argv, :mod:`llmgw.engines`), so the router sends a request for an
adapter to the replicas of its base model.

This module holds the shape (:class:`LoraAdapter`) and the cluster-wide
meaning (:func:`problems`): names unique across models and adapters, sources
the engines can open, settings the model's engines can honour.

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from llmgw.spec import sources
from llmgw.spec.bases import Strict
from llmgw.spec.identifiers import ServedName
from llmgw.spec.servings import Pricing

if TYPE_CHECKING:
    from llmgw.spec.models import Model

# Characters the engines' adapter flags use as separators: llama.cpp's
# --lora-scaled FNAME:SCALE,... and vLLM's/SGLang's name=path.
_SEPARATORS = (",", ":", "=")
MAX_ADAPTERS = 64


class LoraAdapter(Strict):
    name: ServedName = Field(
        description="Name clients call the adapter by, as they would a model (`model:` in a "
        "request); listed in /v1/models with the base model as its `parent`. Unique among "
        "every model's served names and adapters.",
    )
    source: str = Field(
        description="The adapter's files: an absolute path on the node (a directory of "
        "`adapter_config.json` and weights for vLLM and SGLang, a GGUF file for llama.cpp), "
        "or one starting with `./` or `../`, relative to the cluster directory (the `local` "
        "node). It must lie under the node's `weights_dirs`, like a model's path source. "
        "Hub repos and URLs are not fetched for adapters yet.",
    )
    scale: float = Field(
        1.0, gt=0, le=100,
        description="How strongly the adapter applies (llama.cpp only; vLLM and SGLang take "
        "it from the adapter's own `lora_alpha`).",
    )
    rank: int | None = Field(
        None, ge=1, le=512,
        description="The adapter's LoRA rank: vLLM and SGLang reserve memory for the largest "
        "one (`--max-lora-rank`). Default: the engine's own (16 in vLLM).",
    )
    pricing: Pricing | None = Field(
        None, description="Charged for requests to the adapter. Absent: the base model's prices.",
    )

    @field_validator("source")
    @classmethod
    def _path(cls, value: str) -> str:
        parsed = sources.parse(value)  # SourceError is a ValueError: pydantic locates it
        if parsed.kind != "path":
            raise ValueError(
                f"{value!r}: an adapter's source is a path on the node (absolute, or ./ and "
                "../ for the local node); hub repos and URLs are not fetched for adapters")
        if any(ch in value for ch in _SEPARATORS):
            raise ValueError(f"{value!r}: an adapter's path holds no ',', ':' or '=' (the "
                             "engines' adapter flags separate their fields with them)")
        return value


def problems(models: Mapping[str, Model]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(path below ``models``, message) for each adapter that cannot be served as declared."""
    served = {model.served_name or key: key for key, model in models.items()}
    seen: dict[str, str] = {}
    for key, model in models.items():
        adapters = model.adapters
        if not adapters:
            continue
        where = f"models.{key}.adapters"
        if len(adapters) > MAX_ADAPTERS:
            yield (key, "adapters"), f"{where}: at most {MAX_ADAPTERS} adapters per model"
        engines = {profile.engine for profile in model.profiles}
        for index, adapter in enumerate(adapters):
            at = (key, "adapters", index, "name")
            if adapter.name in served:
                yield at, (f"{where}[{index}]: clients already call model "
                           f"'{served[adapter.name]}' by the name '{adapter.name}'; an adapter "
                           "needs a name of its own")
            elif adapter.name in seen:
                yield at, (f"{where}[{index}]: adapter '{adapter.name}' is already declared "
                           f"on model '{seen[adapter.name]}'")
            seen.setdefault(adapter.name, key)
            if adapter.scale != 1.0 and engines - {"llama.cpp"}:
                yield (key, "adapters", index, "scale"), (
                    f"{where}[{index}]: scale applies to llama.cpp only; vLLM and SGLang "
                    "read it from the adapter's own lora_alpha (remove scale, or fold it into "
                    "lora_alpha)")
        if len(engines) > 1:
            # The router rewrites a request for an adapter in the one way its engine
            # expects (llama.cpp: the base name and a lora list; SGLang: base:adapter).
            yield (key, "adapters"), (
                f"{where}: a model with adapters runs on one engine (its profiles use "
                f"{', '.join(sorted(engines))}), since each selects an adapter its own way")
