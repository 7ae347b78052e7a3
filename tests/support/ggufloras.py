"""A tiny LoRA adapter in GGUF for a real base model, written from the format's spec.

llama.cpp loads a LoRA adapter from a GGUF file whose metadata says
``general.type = adapter``, ``adapter.type = lora`` and the base's
``general.architecture``, and whose tensors come in pairs
``<base tensor>.lora_a`` (ne = [base ne0, rank]) and ``.lora_b`` (ne = [rank,
base ne1]) (llama.cpp ``src/llama-adapter.cpp``). :func:`write` reads the
base model's tensor shapes from its header and writes random pairs for the
chosen tensors: enough, at a large scale, to change what the model says.

GGUF v3 (ggml ``docs/gguf.md``): magic, version, tensor and metadata counts;
metadata as key, type, value; tensor infos as name, dims, type, offset; the
data aligned to ``general.alignment`` (32 by default). No numpy needed.
"""

from __future__ import annotations

import random
import struct
from array import array
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
ALIGNMENT = 32
F32 = 0
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
STRING, ARRAY = 8, 9


def _read(stream: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    return struct.unpack("<" + fmt, stream.read(size))[0]


def _string(stream: BinaryIO) -> str:
    return stream.read(_read(stream, "Q")).decode()


def _value(stream: BinaryIO, kind: int) -> Any:
    if kind == STRING:
        return _string(stream)
    if kind == ARRAY:
        inner, count = _read(stream, "I"), _read(stream, "Q")
        return [_value(stream, inner) for _ in range(count)]
    return _read(stream, _SCALARS[kind])


def header(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """A GGUF file's metadata and its tensors' shapes (ne order: fastest dimension first)."""
    with path.open("rb") as stream:
        if stream.read(4) != MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        _version, tensors, kvs = _read(stream, "I"), _read(stream, "Q"), _read(stream, "Q")
        meta = {}
        for _ in range(kvs):
            key = _string(stream)
            meta[key] = _value(stream, _read(stream, "I"))
        shapes = {}
        for _ in range(tensors):
            name = _string(stream)
            dims = tuple(_read(stream, "Q") for _ in range(_read(stream, "I")))
            _read(stream, "I"), _read(stream, "Q")  # type, offset
            shapes[name] = dims
    return meta, shapes


def _put_string(out: bytearray, text: str) -> None:
    data = text.encode()
    out += struct.pack("<Q", len(data)) + data


def write(base: Path, path: Path, targets: str = "ffn_down", rank: int = 4,
          spread: float = 0.5, seed: int = 0) -> list[str]:
    """Write a LoRA adapter for ``base`` at ``path``: random pairs for every tensor whose
    name holds ``targets``; returns the base tensors it adapts."""
    meta, shapes = header(base)
    chosen = sorted(n for n in shapes if targets in n and len(shapes[n]) == 2)
    if not chosen:
        raise ValueError(f"{base} has no 2-D tensor named like {targets!r}")
    rng = random.Random(seed)
    tensors: list[tuple[str, tuple[int, int], array[float]]] = []
    for name in chosen:
        ne0, ne1 = shapes[name]
        stem = name.removesuffix(".weight") + ".weight"
        for suffix, dims in ((".lora_a", (ne0, rank)), (".lora_b", (rank, ne1))):
            values = array("f", (rng.gauss(0.0, spread) for _ in range(dims[0] * dims[1])))
            tensors.append((stem + suffix, dims, values))
    metadata: list[tuple[str, int, Any]] = [
        ("general.architecture", STRING, meta["general.architecture"]),
        ("general.type", STRING, "adapter"),
        ("adapter.type", STRING, "lora"),
        ("adapter.lora.alpha", 6, float(rank)),
    ]
    out = bytearray(MAGIC + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, kind, value in metadata:
        _put_string(out, key)
        out += struct.pack("<I", kind)
        if kind == STRING:
            _put_string(out, value)
        else:
            out += struct.pack("<" + _SCALARS[kind], value)
    offset = 0
    for name, dims, values in tensors:
        _put_string(out, name)
        out += struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", F32, offset)
        offset += -(-len(values) * 4 // ALIGNMENT) * ALIGNMENT
    out += b"\0" * (-len(out) % ALIGNMENT)
    for _, _, values in tensors:
        data = values.tobytes()
        out += data + b"\0" * (-len(data) % ALIGNMENT)
    path.write_bytes(bytes(out))
    return chosen
