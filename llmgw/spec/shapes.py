"""A model's shape: the figures the fit check needs, as the cluster file declares them.

``validate`` reads only the cluster directory (no hub, no node), so what it
knows of a model's size is what the file says: ``shape`` under a model, the
block ``llmgw models show`` prints from the weights' ``config.json`` or GGUF
header. Every field is optional; a figure that is absent makes the part of
the estimate it feeds unknown, and an unknown part never refuses anything
(``llmgw.planning.fits``).

A purely computational module with no side effects.
"""

from __future__ import annotations

from pydantic import Field

from llmgw.spec.bases import Strict
from llmgw.spec.quantities import Size


class Shape(Strict):
    params_b: float | None = Field(
        None, gt=0, le=100_000,
        description="Parameters, in billions (`405` for Llama 3.1 405B). With the profile's "
        "`dtype` or `quantization` it gives the weights' bytes on GPUs.",
    )
    weights_size: Size | None = Field(
        None,
        description="The weights' files as stored, e.g. `15GiB` (a GGUF's file size): used "
        "when the profile neither sets `dtype` nor `quantization` (the engine loads the files "
        "as they are) and no node or hub has said the real size.",
    )
    dtype: str | None = Field(
        None, pattern=r"^[a-z0-9_]{1,32}$",
        description="The dtype the weights are stored in (`config.json`'s `torch_dtype`), "
        "e.g. `bfloat16`: what the engine's `dtype: auto` loads.",
    )
    layers: int | None = Field(
        None, ge=1, le=10_000, description="Transformer layers (`num_hidden_layers`).",
    )
    kv_heads: int | None = Field(
        None, ge=1, le=10_000,
        description="Key/value heads per layer (`num_key_value_heads`; the attention heads "
        "when the model has no grouped-query attention).",
    )
    head_dim: int | None = Field(
        None, ge=1, le=65_536,
        description="Dimension of one head (`head_dim`, else `hidden_size / "
        "num_attention_heads`).",
    )
    context_length: int | None = Field(
        None, ge=1, le=100_000_000,
        description="The longest context the model takes (`max_position_embeddings`): the "
        "context an engine uses when the profile sets none.",
    )
