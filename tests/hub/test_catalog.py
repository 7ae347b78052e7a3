"""`llmgw models search|show` over a mirror directory and a real `llmgw mirror` server as
the hub (HF_ENDPOINT), and the GGUF header parser on the real model and on hostile headers."""

from __future__ import annotations

import json
import socket
import struct
import tracemalloc
from pathlib import Path

import pytest
from mirror_support import GEMMA, GEMMA_REPO, gemma_repo, serving, tiny_model

from llmgw.cli import clusters, main
from llmgw.cli.errors import UserError
from llmgw.discovery import architectures
from llmgw.discovery.architectures import Malformed, Truncated
from llmgw.hub import caches, listings

needs_gemma = pytest.mark.skipif(not GEMMA.exists(), reason="the test model is not built yet")


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + payload


def _header(kvs: list[bytes], tensors: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, len(kvs)) + b"".join(kvs)


@needs_gemma
def test_the_real_ggufs_header() -> None:
    with GEMMA.open("rb") as handle:
        found = architectures.from_gguf(handle.read(listings.HEADER_BYTES))
    assert found.architecture == "gemma3"
    assert (found.layers, found.kv_heads, found.head_dim) == (18, 1, 256)
    assert found.context_length == 32768
    assert found.quantisation == "Q4_K_M"  # general.file_type 15, not the file's name
    assert found.params is not None and 0.26e9 < found.params < 0.28e9  # a 270M model


@needs_gemma
def test_a_prefix_ending_inside_the_key_values_says_so() -> None:
    with GEMMA.open("rb") as handle:
        raw = handle.read(100_000)
    with pytest.raises(Truncated, match="past the 100000 bytes read"):
        architectures.from_gguf(raw)


@pytest.mark.parametrize(("raw", "error"), [
    pytest.param(_header([_kv("general.name", 8, struct.pack("<Q", 2**63))]), Truncated,
                 id="a string of 2^63 bytes"),
    pytest.param(_header([_kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 10**12))]),
                 Malformed, id="an array of 10^12 strings"),
    pytest.param(_header([_kv("x", 9, struct.pack("<IQ", 4, 2**40))]), Malformed,
                 id="an array of 2^40 integers"),
    pytest.param(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40), Malformed, id="2^40 key/values"),
    pytest.param(_header([struct.pack("<Q", 2**32) + b"k"]), Malformed, id="a 4 GiB key"),
    pytest.param(_header([_kv("x", 99, b"")]), Malformed, id="an unknown value type"),
    pytest.param(_header([], version=99), Malformed, id="version 99"),
    pytest.param(b"\x00" * 64, Malformed, id="not GGUF"),
    pytest.param(_header([], tensors=1) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 2**31),
                 Malformed, id="a tensor of 2^31 dimensions"),
])
def test_a_hostile_header_is_refused_without_reading_or_allocating(raw: bytes,
                                                                   error: type) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(error):
            architectures.from_gguf(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"parsing {len(raw)} bytes took {peak} bytes"


def test_config_json_figures_and_a_multimodal_text_config() -> None:
    llama = architectures.from_config(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16"}).encode())
    assert (llama.architecture, llama.layers, llama.kv_heads, llama.head_dim) == (
        "LlamaForCausalLM", 32, 8, 128)
    assert (llama.context_length, llama.dtype) == (131072, "bfloat16")
    gemma = architectures.from_config(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": 34, "num_attention_heads": 8,
                        "num_key_value_heads": 4, "head_dim": 256,
                        "max_position_embeddings": 131072}}).encode())
    assert (gemma.layers, gemma.kv_heads, gemma.head_dim) == (34, 4, 256)
    with pytest.raises(Malformed):
        architectures.from_config(b"[1, 2]")


@pytest.mark.parametrize(("name", "quant"), [
    ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M"), ("Llama-3.1-8B-Instruct-IQ4_XS.gguf", "IQ4_XS"),
    ("model-q8_0.gguf", "Q8_0"), ("x-BF16-00001-of-00002.gguf", "BF16"),
    ("model.safetensors", None), ("QwQ-32B.gguf", None),
])
def test_quantisation_from_a_file_name(name: str, quant: str | None) -> None:
    assert architectures.quantisation(name) == quant


def test_the_mirror_answers_the_hub_clients_search(tmp_path: Path) -> None:
    from huggingface_hub import HfApi

    root = tmp_path / "hub"
    caches.add(root, "org/tiny-chat", tiny_model(tmp_path / "files"))
    caches.add(root, "other/embedder", tiny_model(tmp_path / "files2"))
    with serving(root) as mirror:
        api = HfApi(endpoint=mirror.url, token=False)
        assert [m.id for m in api.list_models(search="TINY")] == ["org/tiny-chat"]
        assert [m.id for m in api.list_models(search="", limit=1)] == ["org/tiny-chat"]
        with pytest.raises(listings.ListingError, match="400"):
            listings.hub_search(mirror.url, "x" * 201)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@needs_gemma
def test_search_and_show_over_a_mirror_and_the_hub(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    served, local = tmp_path / "served" / "hub", tmp_path / "local"
    gemma_repo(served)
    caches.add(local / "hub", "org/tiny-chat", tiny_model(tmp_path / "files"))
    with serving(served) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.url)
        code, out, _ = _run(["models", "search", "i", "--mirror", str(local)], capsys)
        rows = [line.split() for line in out.splitlines()]
        assert code == 0 and rows[0][:3] == ["REPO", "WHERE", "SIZE"]
        assert rows[1][:2] == ["org/tiny-chat", "mirror"] and rows[1][-2:] == ["tiny",
                                                                              "unknown"]
        assert rows[2][:2] == [GEMMA_REPO, "hub"] and "Q4_K_M" in rows[2]
        code, out, _ = _run(["models", "show", f"{GEMMA_REPO}:Q4_K_M", "--gpu-class",
                             "l4-22g"], capsys)
    assert code == 0
    assert "architecture   gemma3: 18 layers, 1 KV head of 256, context 32768 tokens" in out
    assert "l4-22g       fits on 1× l4-22g at 8k and 32k context" in out
    shape = next(line for line in out.splitlines() if line.startswith("    shape: "))
    # What show prints is what a cluster file takes, and validate passes it.
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "cluster.yaml").write_text(
        "cluster: {name: lab}\nmodels:\n  gemma:\n    source: " + GEMMA_REPO + "\n"
        + shape + "\n"
        "    profiles: [{engine: llama.cpp, gpu_class: l4-22g}]\n")
    cluster = clusters.load(tmp_path / "cluster")
    shape_of = cluster.models["gemma"].shape
    assert shape_of is not None and shape_of.layers == 18
    assert shape_of.weights_size is not None and shape_of.weights_size >= GEMMA.stat().st_size


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_hub_out_of_reach_is_a_note_when_the_mirror_answered(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    caches.add(tmp_path / "hub", "org/tiny-chat", tiny_model(tmp_path / "files"))
    hub = f"http://127.0.0.1:{_closed_port()}"  # bound and closed: nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", hub)
    code, out, err = _run(["models", "search", "tiny", "--mirror", str(tmp_path)], capsys)
    assert code == 0 and "org/tiny-chat" in out
    assert f"note: cannot search {hub}" in err
    args = main.build_parser().parse_args(["models", "search", "tiny"])
    with pytest.raises(UserError, match=f"cannot search {hub}"):
        args.handler(args)
