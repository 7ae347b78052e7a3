"""Writers of real safetensors and GGUF files for the weights tests (tiny, but valid)."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def safetensors(path: Path, tensors: dict[str, int], cut: int = 0, extra: int = 0) -> Path:
    """A BF16 safetensors file with 1-D tensors of the given lengths.

    ``cut`` drops that many bytes from the end (an interrupted download),
    ``extra`` appends garbage (a file that is not what its header says).
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, length in tensors.items():
        end = offset + 2 * length
        header[name] = {"dtype": "BF16", "shape": [length], "data_offsets": [offset, end]}
        offset += 2 * length
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = struct.pack("<Q", len(raw)) + raw + bytes(offset) + bytes(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) - cut] if cut else data)
    return path


def model(directory: Path, shards: int, missing: tuple[int, ...] = (), index: bool = True) -> Path:
    """A sharded Hugging Face model directory, optionally with shards missing."""
    weight_map = {}
    for k in range(1, shards + 1):
        name = f"model-{k:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{k}.weight": 32, f"layers.{k}.bias": 4}
        weight_map.update({t: name for t in tensors})
        if k not in missing:
            safetensors(directory / name, tensors)
    if index:
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 72 * shards}, "weight_map": weight_map})
        )
    (directory / "config.json").write_text('{"model_type": "llama"}')
    return directory


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(path: Path, cut: int = 0, alignment: int | None = None, vocab: int = 50) -> Path:
    """A GGUF v3 file: metadata (with a string array, like a tokenizer) and two tensors,
    an F32 vector and a Q4_K matrix, whose block size decides where the file ends."""
    kv = [_string("general.architecture") + struct.pack("<I", 8) + _string("llama")]
    kv.append(_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, vocab)
              + b"".join(_string(f"tok{i}") for i in range(vocab)))
    kv.append(_string("llama.rope.dimension_count") + struct.pack("<I", 4) + struct.pack("<I", 128))
    if alignment is not None:
        kv.append(_string("general.alignment") + struct.pack("<II", 4, alignment))
    align = alignment or 32
    norm = 64 * 4  # F32 vector first, so the quantized matrix ends the file
    q4k = 256 * 4 // 256 * 144  # 4 blocks of 256 elements, 144 bytes each
    infos = (_string("output_norm.weight") + struct.pack("<I", 1) + struct.pack("<Q", 64)
             + struct.pack("<IQ", 0, 0))
    infos += (_string("blk.0.attn_q.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 256, 4)
              + struct.pack("<IQ", 12, norm))
    head = b"GGUF" + struct.pack("<IQQ", 3, 2, len(kv)) + b"".join(kv) + infos
    head += bytes(-len(head) % align)
    data = head + bytes(norm) + bytes(q4k)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) - cut] if cut else data)
    return path
