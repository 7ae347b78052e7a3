"""`llmgw validate` on vLLM CPU profiles: what vLLM's CPU backend would ignore or refuse,
at file:line:col, and the shapes it runs (one node, or ranks across nodes over TCP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.main import main

CLUSTER = """\
cluster: {name: lab}
nodes:
  cpu-01: {address: 10.0.0.11, weights_dirs: [/models]}
  cpu-02: {address: 10.0.0.12, weights_dirs: [/models]}
models:
  tiny:
    source: /models/tiny
    profiles:
      - engine: vllm
        engine_version: "0.32.0"
        cpu: true
        args: {max-model-len: 512, enforce-eager: true, kv-cache-memory-bytes: 67108864}
  split:
    source: /models/tiny
    profiles:
      - engine: vllm
        engine_version: "0.32.0"
        cpu: true
        nodes: 2
        tensor_parallel: 2
        env: {VLLM_CPU_KVCACHE_SPACE: "1"}
"""


def errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> list[str]:
    (tmp_path / "cluster.yaml").write_text(text)
    code = main(["validate", "--cluster", str(tmp_path)])
    lines = capsys.readouterr().err.splitlines()
    assert code == (1 if lines else 0), lines
    return [line.split("cluster.yaml:", 1)[1] for line in lines if "cluster.yaml:" in line]


def test_cpu_profiles_one_node_and_across_nodes_validate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 0.32 table knows --headless (vllm/entrypoints/launchers/cli_args.py), which every
    rank but 0 of a native multi-node replica gets; no fabric is needed on CPU."""
    assert errors(tmp_path, capsys, CLUSTER) == []


@pytest.mark.parametrize(("edit", "found"), [
    pytest.param(("enforce-eager: true", "enforce-eager: true, enable-dbo: true"),
                 ["12:69: models.tiny.profiles[0]: args.enable-dbo needs a GPU: dual-batch "
                  "overlap is not supported on CPU (vLLM turns it off); remove it from this "
                  "cpu: true profile"], id="gpu-only-flag"),
    pytest.param((", kv-cache-memory-bytes: 67108864", ""),
                 ["11:14: models.tiny.profiles[0]: vLLM on CPU needs its KV cache size: set "
                  "args.kv-cache-memory-bytes (bytes) or env.VLLM_CPU_KVCACHE_SPACE (GiB); "
                  "without one vLLM reserves gpu-memory-utilization (0.92 by default) of the "
                  "node's whole memory and refuses to start when less is free"],
                 id="no-kv-cache-size"),
    pytest.param(("tensor_parallel: 2", "tensor_parallel: 3"),
                 ["19:16: models.split.profiles[0]: tensor_parallel × pipeline_parallel = 3 × 1 "
                  "= 3 workers cannot be split evenly over 2 nodes"], id="uneven-split"),
    pytest.param(("engine: vllm\n        engine_version: \"0.32.0\"\n        cpu: true\n"
                  "        args", "engine: sglang\n        engine_version: \"0.5.23\"\n"
                  "        cpu: true\n        args"),
                 ["9:9: models.tiny.profiles[0]: `cpu: true` needs engine llama.cpp or vllm "
                  "(its CPU backend); sglang needs GPUs"], id="sglang-on-cpu"),
])
def test_what_vllm_on_cpu_would_ignore_or_refuse_is_a_located_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str],
        found: list[str]) -> None:
    old, new = edit
    assert old in CLUSTER
    assert errors(tmp_path, capsys, CLUSTER.replace(old, new, 1)) == found
