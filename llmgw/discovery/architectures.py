"""What a model is, read from its ``config.json`` or its GGUF header: for ``llmgw models``.

Two pure parsers over bytes the caller read (a bounded prefix of a file, never
the whole of a large one):

* :func:`from_config`: a hub ``config.json`` (a multimodal model's figures sit
  in ``text_config``).
* :func:`from_gguf`: the GGUF (v2/v3) header: its key/values and, when the
  prefix reaches them, its tensor infos (whose elements sum to the
  parameter count). A hostile header cannot make it allocate: every length
  is checked against the bytes it was given before anything is sliced, and
  counts are bounded. A prefix that ends inside the key/values raises
  :class:`Truncated`, saying how many bytes were read.

:func:`quantisation` names a GGUF quantisation from a file name (``Q4_K_M``).

A purely computational module with no side effects.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.spec.shapes import Shape

MAX_KEY = 64 * 1024  # bytes of one metadata key
MAX_COUNT = 10_000_000  # entries of a header or an array: more is corrupt
# llama.cpp's LLAMA_FTYPE_MOSTLY_* (llama.h): general.file_type → the name its files use.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}
_QUANT_NAME = re.compile(
    r"(?<![A-Za-z0-9])(I?Q[1-8]_(?:K_[SML]|K|[0-9]|XXS|XS|NL|[SML])(?:_[SML])?|TQ[12]_0|"
    r"MXFP4(?:_MOE)?|BF16|F16|F32|FP16)(?![A-Za-z0-9])", re.IGNORECASE)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_WANTED = ("block_count", "context_length", "attention.head_count",
           "attention.head_count_kv", "embedding_length", "attention.key_length")


class Truncated(ValueError):
    """The bytes end before the part of the header that was wanted."""


class Malformed(ValueError):
    """Not a GGUF header, or one no writer produces; says why."""


@dataclass(frozen=True)
class Architecture:
    """A model's figures; ``None`` is not known."""

    architecture: str | None = None
    params: int | None = None
    params_from: str = ""  # "the GGUF's tensors", "the files at bfloat16"
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    context_length: int | None = None
    dtype: str | None = None
    quantisation: str | None = None  # a GGUF's file type

    def shape(self, weights_size: int | None = None) -> Shape:
        """The ``shape`` block a cluster file declares for this model."""
        params_b = round(self.params / 1e9, 3) if self.params else None
        return Shape(params_b=params_b or None, weights_size=weights_size,
                     dtype=self.dtype if self.dtype and re.fullmatch(r"[a-z0-9_]{1,32}",
                                                                     self.dtype) else None,
                     layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim,
                     context_length=self.context_length)


def quantisation(name: str) -> str | None:
    """``Q4_K_M`` for ``gemma-3-270m-it-Q4_K_M.gguf``; None when the name says none."""
    found = _QUANT_NAME.findall(name.rsplit("/", 1)[-1])
    return found[-1].upper() if found else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def from_config(raw: bytes) -> Architecture:
    """The figures of a hub ``config.json``; raises Malformed when it is not a JSON object."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise Malformed("config.json is not JSON") from None
    if not isinstance(data, dict):
        raise Malformed("config.json is not a JSON object")
    text = data.get("text_config")
    figures: Mapping[str, Any] = {**data, **text} if isinstance(text, dict) else data
    names = data.get("architectures")
    architecture = (names[0] if isinstance(names, list) and names and isinstance(names[0], str)
                    else data.get("model_type"))
    heads = _int(figures.get("num_attention_heads"))
    hidden = _int(figures.get("hidden_size"))
    head_dim = _int(figures.get("head_dim")) or (hidden // heads if hidden and heads else None)
    dtype = figures.get("torch_dtype") or figures.get("dtype")
    return Architecture(
        architecture=str(architecture)[:64] if architecture else None,
        layers=_int(figures.get("num_hidden_layers")),
        kv_heads=_int(figures.get("num_key_value_heads")) or heads,
        head_dim=head_dim,
        context_length=_int(figures.get("max_position_embeddings")),
        dtype=str(dtype)[:32] if isinstance(dtype, str) else None,
    )


class _Reader:
    """Bounded reads over a prefix: every length is checked before a byte is sliced."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, size: int) -> memoryview:
        if size < 0 or self.at + size > len(self.data):
            raise Truncated(f"the header goes on past the {len(self.data)} bytes read")
        chunk = self.data[self.at:self.at + size]
        self.at += size
        return chunk

    def scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return int(self.scalar(4))

    def u64(self) -> int:
        return int(self.scalar(10))

    def string(self, limit: int | None = None) -> memoryview:
        size = self.u64()
        if limit is not None and size > limit:
            raise Malformed(f"a string of {size} bytes where at most {limit} belong")
        return self.take(size)

    def value(self, kind: int, keep: bool) -> Any:
        """One metadata value: returned when ``keep``, else skipped without copying."""
        if kind in _SCALARS:
            return self.scalar(kind)
        if kind == 8:
            text = self.string()
            return bytes(text[:256]).decode("utf-8", "replace") if keep else None
        if kind == 9:
            item, count = self.u32(), self.u64()
            if count > MAX_COUNT:
                raise Malformed(f"an array of {count} entries")
            if item in _SCALARS:
                self.take(count * struct.calcsize(_SCALARS[item]))
            else:
                for _ in range(count):
                    self.value(item, False)
            return None
        raise Malformed(f"metadata type {kind} is not GGUF's")


def from_gguf(data: bytes) -> Architecture:
    """The figures of a GGUF file from its first bytes ``data``.

    Raises Malformed for what is not a GGUF v2/v3 header, and Truncated when
    ``data`` ends before the key/values do. The parameter count needs the
    tensor infos after them: when ``data`` ends inside those, it is unknown.
    """
    reader = _Reader(data)
    if bytes(reader.take(4)) != b"GGUF":
        raise Malformed("not a GGUF file")
    version = reader.u32()
    if version not in (2, 3):
        raise Malformed(f"GGUF version {version} is not supported")
    tensors, kvs = reader.u64(), reader.u64()
    if tensors > MAX_COUNT or kvs > MAX_COUNT:
        raise Malformed("corrupt header counts")
    found: dict[str, Any] = {}
    for _ in range(kvs):
        key = bytes(reader.string(MAX_KEY)).decode("utf-8", "replace")
        kind = reader.u32()
        keep = key in ("general.architecture", "general.file_type") or key.endswith(_WANTED)
        value = reader.value(kind, keep)
        if keep:
            found[key] = value
    params = _params(reader, tensors)
    arch = found.get("general.architecture")
    arch = arch if isinstance(arch, str) else None

    def figure(name: str) -> int | None:
        return _int(found.get(f"{arch}.{name}")) if arch else None

    heads = figure("attention.head_count")
    hidden = figure("embedding_length")
    file_type = found.get("general.file_type")
    return Architecture(
        architecture=arch[:64] if arch else None,
        params=params, params_from="the GGUF's tensors" if params else "",
        layers=figure("block_count"),
        kv_heads=figure("attention.head_count_kv") or heads,
        head_dim=figure("attention.key_length") or (hidden // heads if hidden and heads
                                                    else None),
        context_length=figure("context_length"),
        quantisation=FILE_TYPES.get(file_type) if isinstance(file_type, int) else None,
    )


def _params(reader: _Reader, tensors: int) -> int | None:
    """Elements of every tensor, or None when the prefix ends inside their infos."""
    total = 0
    try:
        for _ in range(tensors):
            reader.string(MAX_KEY)
            dims = reader.u32()
            if dims > 8:
                raise Malformed(f"a tensor of {dims} dimensions")
            elements = 1
            for _ in range(dims):
                elements *= reader.u64()
            reader.u32()  # ggml type
            reader.u64()  # offset
            total += elements
    except Truncated:
        return None
    return total or None
