"""Weights present means complete: safetensors sets and GGUF files, read from their headers."""

from __future__ import annotations

from pathlib import Path

import pytest
from weightfiles import gguf, model, safetensors

from llmgw.discovery import weights

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"


def found(root: Path) -> tuple[list[tuple[str, str]], list[str]]:
    result = weights.find([str(root)])
    return [(str(Path(w.path).relative_to(root)), w.format) for w in result.weights], result.notes


def test_complete_sharded_model_is_weights(tmp_path: Path) -> None:
    model(tmp_path / "org" / "m", shards=3)
    assert found(tmp_path) == ([("org/m", "safetensors")], [])
    [w] = weights.find([str(tmp_path)]).weights
    assert w.size_bytes == sum(p.stat().st_size for p in (tmp_path / "org/m").glob("*.safetensors"))


@pytest.mark.parametrize(
    ("damage", "note"),
    [
        ("missing", "model-00002-of-00003.safetensors is missing"),
        ("truncated", "model-00002-of-00003.safetensors: "),
        ("padded", "its header says"),
        ("garbage", "not a safetensors file"),
    ],
)
def test_a_damaged_shard_is_a_partial_download(tmp_path: Path, damage: str, note: str) -> None:
    directory = model(tmp_path / "m", shards=3, missing=(2,) if damage == "missing" else ())
    shard = directory / "model-00002-of-00003.safetensors"
    if damage == "truncated":
        safetensors(shard, {"layers.2.weight": 32, "layers.2.bias": 4}, cut=10)
    elif damage == "padded":
        safetensors(shard, {"layers.2.weight": 32, "layers.2.bias": 4}, extra=3)
    elif damage == "garbage":
        shard.write_bytes(b"\xff" * 64)
    listed, notes = found(tmp_path)
    assert listed == []
    assert len(notes) == 1 and "partial safetensors" in notes[0] and note in notes[0]


def test_shards_without_index_need_every_part(tmp_path: Path) -> None:
    model(tmp_path / "complete", shards=2, index=False)
    model(tmp_path / "partial", shards=3, missing=(3,), index=False)
    listed, notes = found(tmp_path)
    assert listed == [("complete", "safetensors")]
    assert "model-00003-of-00003.safetensors is missing" in notes[0]


def test_single_safetensors_file(tmp_path: Path) -> None:
    safetensors(tmp_path / "tiny" / "model.safetensors", {"w": 8})
    assert found(tmp_path) == ([("tiny", "safetensors")], [])


def test_complete_gguf_is_weights(tmp_path: Path) -> None:
    path = gguf(tmp_path / "qwen2.5-7b-q4_k_m.gguf")
    [w] = weights.find([str(tmp_path)]).weights
    assert (w.path, w.format, w.size_bytes) == (str(path), "gguf", path.stat().st_size)
    aligned = gguf(tmp_path / "x" / "aligned.gguf", alignment=64)
    assert weights.gguf_size(aligned) == aligned.stat().st_size


@pytest.mark.parametrize(
    ("cut", "note"), [(8, "of"), (900, "of"), (1500, "cut short inside its header")]
)
def test_a_cut_gguf_is_a_partial_download(tmp_path: Path, cut: int, note: str) -> None:
    gguf(tmp_path / "m.gguf", cut=cut)
    listed, notes = found(tmp_path)
    assert listed == [] and "partial GGUF" in notes[0] and note in notes[0]


def test_split_gguf_needs_every_part(tmp_path: Path) -> None:
    for k in (1, 2):
        gguf(tmp_path / "big" / f"m-{k:05d}-of-00002.gguf")
    for k in (1, 3):
        gguf(tmp_path / "cut" / f"m-{k:05d}-of-00003.gguf")
    listed, notes = found(tmp_path)
    assert listed == [("big/m-00001-of-00002.gguf", "gguf")]
    assert "m-00002-of-00003.gguf is missing" in notes[0]


def test_not_weights(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.gguf").write_text("not a model")
    gguf(tmp_path / ".cache" / "huggingface" / "download" / "m.gguf")  # hidden: skipped
    gguf(tmp_path / "a" / "b" / "c" / "d" / "e" / "deep.gguf")  # deeper than MAX_DEPTH
    listed, notes = found(tmp_path)
    assert listed == [] and notes == ["%s: partial GGUF (notes.gguf: not a GGUF file)"
                                      % (tmp_path / "notes.gguf")]
    assert weights.find([str(tmp_path / "absent")]).weights == []


def test_headers_are_read_once_per_file_version(tmp_path: Path) -> None:
    path = gguf(tmp_path / "m.gguf")
    cache: weights.Cache = {}
    assert weights.find([str(tmp_path)], cache).weights
    assert len(cache) == 1
    path.write_bytes(path.read_bytes()[:-8])  # the file changes: read again
    assert weights.find([str(tmp_path)], cache).weights == []


@pytest.mark.parametrize(
    ("node", "present", "partial"),
    [
        ("h100-ib", ["meta-llama/Llama-3.1-8B-Instruct"], ["Qwen/Qwen2.5-72B-Instruct"]),
        ("a100-roce", ["mistralai/Mistral-7B-Instruct-v0.3"], []),
        ("cpu-only", ["qwen2.5-coder-14b-instruct-q4_k_m.gguf"],
         ["llama-3.2-1b-instruct-q8_0.gguf"]),
        ("l40s-nofabric", [], []),
    ],
)
def test_fixture_nodes(node: str, present: list[str], partial: list[str]) -> None:
    root = NODES / node / "models"
    result = weights.find([str(root)])
    assert [str(Path(w.path).relative_to(root)) for w in result.weights] == present
    assert len(result.notes) == len(partial)
    for name, note in zip(partial, result.notes, strict=True):
        assert str(root / name) in note
