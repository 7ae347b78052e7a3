"""Model weights present on the node: complete safetensors sets and GGUF files.

"Present" means complete. A partial download (a missing shard, a file cut
short, a header promising more bytes than the file holds) is not weights:
placing a replica there would fail minutes later while loading. Each such
directory or file is reported with the reason instead.

Completeness is read from the files' own headers, never from names alone:

* safetensors: 8-byte little-endian header length, JSON header, then data;
  the file must be exactly as long as its last tensor's end offset says.
  A sharded set needs every file its ``*.safetensors.index.json`` names (or,
  without an index, every ``-0000k-of-0000n`` shard).
* GGUF (v2/v3): header, key/values, tensor infos, aligned data; the file must
  hold the last tensor's bytes, whose size follows from its ggml type. A
  split GGUF (``-0000k-of-0000n.gguf``) needs every part.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from llmgw.fleet.types import Weights

MAX_DEPTH = 4  # /models/<org>/<name>/ and the HF cache's models--o--n/snapshots/<rev>/
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<k>\d{5})-of-(?P<n>\d{5})\.(?P<ext>safetensors|gguf)$")
_MAX_COUNT = 10_000_000  # a header claiming more entries than this is corrupt

# ggml tensor types: id → (elements per block, bytes per block), from ggml.h / ggml.c.
GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
    18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}
# GGUF metadata value types: id → fixed size in bytes (8 string and 9 array are variable).
_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class Incomplete(Exception):
    """Why a file is not complete weights."""


@dataclass
class Found:
    weights: list[Weights] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Verdict:
    size: int
    problem: str | None = None


Cache = MutableMapping[tuple[str, int, int], _Verdict]


def safetensors_size(path: Path) -> int:
    """The size a complete safetensors file has, read from its header; raises Incomplete."""
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise Incomplete("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > 100 * 1024 * 1024:
            raise Incomplete("not a safetensors file (header length is implausible)")
        raw = handle.read(length)
    if len(raw) < length:
        raise Incomplete("cut short inside its header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise Incomplete(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise Incomplete("header is not a JSON object")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise Incomplete(f"tensor {name!r} has no data_offsets")
        end = max(end, int(offsets[1]))
    return 8 + int(length) + end


def _exact(handle: BinaryIO, size: int) -> bytes:
    data = handle.read(size)
    if len(data) < size:
        raise Incomplete("cut short inside its header")
    return data


def _u32(handle: BinaryIO) -> int:
    value: int = struct.unpack("<I", _exact(handle, 4))[0]
    return value


def _u64(handle: BinaryIO) -> int:
    value: int = struct.unpack("<Q", _exact(handle, 8))[0]
    return value


def _skip_string(handle: BinaryIO) -> None:
    handle.seek(_u64(handle), os.SEEK_CUR)


def _skip_value(handle: BinaryIO, kind: int) -> int | None:
    """Skip one metadata value; returns it when it is a small unsigned integer."""
    if kind in (4, 10):
        return _u32(handle) if kind == 4 else _u64(handle)
    if kind in _GGUF_SCALARS:
        _exact(handle, _GGUF_SCALARS[kind])
    elif kind == 8:
        _skip_string(handle)
    elif kind == 9:
        item, count = _u32(handle), _u64(handle)
        if count > _MAX_COUNT:
            raise Incomplete("corrupt metadata array")
        if item in _GGUF_SCALARS:
            handle.seek(count * _GGUF_SCALARS[item], os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(handle, item)
    else:
        raise Incomplete(f"unknown metadata type {kind}")
    return None


def gguf_size(path: Path) -> int:
    """The size a complete GGUF file has, read from its header; raises Incomplete."""
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise Incomplete("not a GGUF file")
        version = _u32(handle)
        if version not in (2, 3):
            raise Incomplete(f"GGUF version {version} is not supported")
        tensors, kvs = _u64(handle), _u64(handle)
        if tensors > _MAX_COUNT or kvs > _MAX_COUNT:
            raise Incomplete("corrupt header counts")
        alignment = 32
        for _ in range(kvs):
            key = _exact(handle, _u64(handle))
            small = _skip_value(handle, _u32(handle))
            if key == b"general.alignment" and small:
                alignment = small
        end = 0
        for _ in range(tensors):
            _skip_string(handle)
            dims = [_u64(handle) for _ in range(_u32(handle))]
            kind, offset = _u32(handle), _u64(handle)
            if kind not in GGML_TYPES:
                raise Incomplete(f"tensor type {kind} is unknown to llmgw")
            block, size = GGML_TYPES[kind]
            elements = 1
            for dim in dims:
                elements *= dim
            end = max(end, offset + elements // block * size)
        data_start = -(-handle.tell() // alignment) * alignment
    return data_start + end


def _verdict(path: Path, cache: Cache | None) -> _Verdict:
    """Whether one file is complete, memoised on (path, size, mtime)."""
    try:
        stat = path.stat()
    except OSError as exc:
        return _Verdict(0, f"{path.name}: {exc.strerror or exc}")
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if cache is not None and key in cache:
        return cache[key]
    try:
        expected = gguf_size(path) if path.suffix == ".gguf" else safetensors_size(path)
        if stat.st_size < expected:
            problem: str | None = f"{path.name}: {stat.st_size} of {expected} bytes"
        elif path.suffix == ".safetensors" and stat.st_size != expected:
            problem = f"{path.name}: {stat.st_size} bytes, its header says {expected}"
        else:
            problem = None
    except Incomplete as exc:
        problem = f"{path.name}: {exc}"
    except OSError as exc:
        problem = f"{path.name}: {exc.strerror or exc}"
    verdict = _Verdict(stat.st_size, problem)
    if cache is not None:
        cache[key] = verdict
    return verdict


def _set_size(files: Iterable[Path], cache: Cache | None) -> tuple[int, list[str]]:
    total, problems = 0, []
    for path in files:
        if not path.exists():
            problems.append(f"{path.name} is missing")
            continue
        verdict = _verdict(path, cache)
        total += verdict.size
        if verdict.problem:
            problems.append(verdict.problem)
    return total, problems


def _shard_sets(names: Iterable[str], ext: str) -> tuple[dict[str, list[str]], list[str]]:
    """Sharded file sets (stem → every expected name) and the unsharded names."""
    sets: dict[str, list[str]] = {}
    single = []
    for name in sorted(names):
        match = _SHARD.match(name)
        if match and match.group("ext") == ext:
            stem, total = match.group("stem"), int(match.group("n"))
            sets[stem] = [f"{stem}-{k:05d}-of-{total:05d}.{ext}" for k in range(1, total + 1)]
        elif name.endswith("." + ext):
            single.append(name)
    return sets, single


def _safetensors(directory: Path, names: list[str], found: Found, cache: Cache | None) -> None:
    indexes = [n for n in names if n.endswith(".safetensors.index.json")]
    groups: list[list[str]] = []
    if indexes:
        for index in indexes:
            try:
                weight_map = json.loads((directory / index).read_text())["weight_map"]
                groups.append(sorted(set(weight_map.values())))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                found.notes.append(f"{directory}: {index} is unreadable ({exc}); not weights")
                return
    else:
        sets, single = _shard_sets(names, "safetensors")
        groups = list(sets.values()) + [[name] for name in single]
    files = sorted({name for group in groups for name in group})
    if not files:
        return
    total, problems = _set_size((directory / name for name in files), cache)
    if problems:
        found.notes.append(f"{directory}: partial safetensors ({'; '.join(problems[:3])})")
    else:
        found.weights.append(Weights(path=str(directory), format="safetensors", size_bytes=total))


def _ggufs(directory: Path, names: list[str], found: Found, cache: Cache | None) -> None:
    sets, single = _shard_sets(names, "gguf")
    groups = list(sets.values()) + [[name] for name in single]
    for group in groups:
        total, problems = _set_size((directory / name for name in group), cache)
        path = directory / group[0]
        if problems:
            found.notes.append(f"{path}: partial GGUF ({'; '.join(problems[:3])})")
        else:
            found.weights.append(Weights(path=str(path), format="gguf", size_bytes=total))


def find(dirs: Iterable[str], cache: Cache | None = None) -> Found:
    """Complete weights under each directory (up to :data:`MAX_DEPTH` levels).

    Returns the weights found and notes on what looked like weights but is
    not complete. Hidden directories (``.cache``, download scratch space)
    are skipped. ``cache`` memoises header reads across calls.
    """
    found = Found()
    for root in dirs:
        base = Path(root)
        if not base.is_dir():
            continue
        for current, subdirs, files in os.walk(base, followlinks=True):
            directory = Path(current)
            depth = len(directory.relative_to(base).parts)
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and depth < MAX_DEPTH)
            _safetensors(directory, files, found, cache)
            _ggufs(directory, files, found, cache)
    return found

