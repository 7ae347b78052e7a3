"""`llmgw validate` reports what an engine version would refuse, at file:line:col."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.main import main

CLUSTER = """\
cluster: {name: lab}
nodes:
  gpu-01: {address: 10.0.0.11, gpus: [{class: l40s-45g, count: 4}]}
models:
  bge-m3:
    source: BAAI/bge-m3
    profiles:
      - engine: vllm
        engine_version: "0.31.0"
        gpu_class: l40s-45g
        args: {task: embed, max-model-len: 8192}
  qwen:
    source: Qwen/Qwen2.5-7B-Instruct
    profiles:
      - engine: sglang
        engine_version: "0.5.1"
        gpu_class: l40s-45g
        unchecked_args: {brand-new-flag: 1}
"""


def test_removed_and_unknown_versions_are_located_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    assert main(["validate", "--cluster", str(tmp_path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith(
        "cluster.yaml:11:22: models.bge-m3.profiles[0]: args.task: `task` was removed in "
        "vLLM 0.13; use `runner: pooling` (embeddings, scores) or `runner: generate`")
    assert lines[1].endswith(
        "cluster.yaml:16:25: models.qwen.profiles[0]: SGLang 0.5.1 is older than every flag "
        "table llmgw has (0.5.10.post1, 0.5.21, 0.5.22, 0.5.23); use a newer engine, or "
        "generate its table with `make engine-flags`")
    assert "error: 2 errors" in lines[-1]


def test_the_fixed_profile_validates(tmp_path: Path) -> None:
    fixed = CLUSTER.replace("task: embed", "runner: pooling").replace('"0.5.1"', '"0.5.22"')
    (tmp_path / "cluster.yaml").write_text(fixed)
    assert main(["validate", "--cluster", str(tmp_path)]) == 0


def test_requirements_files_apply_installs_are_checked_at_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`llmgw apply` installs vLLM/SGLang versions from engines/<engine>-<version>.txt:
    `llmgw validate` checks those files first, each error at file:line:col."""
    (tmp_path / "cluster.yaml").write_text(CLUSTER.replace('"0.31.0"', '"0.33.0"').replace(
        "args: {task: embed, max-model-len: 8192}", "args: {max-model-len: 8192}").replace(
        '"0.5.1"', '"0.5.23"'))
    assert main(["validate", "--cluster", str(tmp_path)]) == 0, capsys.readouterr().err
    engines = tmp_path / "engines"
    engines.mkdir()
    good = f"vllm==0.33.0 \\\n    --hash=sha256:{'a' * 64}\n"
    (engines / "vllm-0.33.0.txt").write_text(good)
    assert main(["validate", "--cluster", str(tmp_path)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    (engines / "sglang-0.5.23.txt").write_text(f"# pinned\nsglang>=0.5 --hash=sha256:{'b' * 64}\n")
    (engines / "llama.cpp-11434.0.0.txt").write_text(good)
    assert main(["validate", "--cluster", str(tmp_path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("engines/llama.cpp-11434.0.0.txt:1:1: not a requirements file")
    assert lines[1].startswith("engines/sglang-0.5.23.txt:2:1: ")
    assert len(lines) == 2


MULTI_NODE = """\
cluster: {name: lab}
fabrics: {ib: {kind: infiniband}}
nodes:
  gpu-01: {address: 10.0.0.11, mgmt_interface: eno1, fabrics: {ib: [mlx5_0]},
           gpus: [{class: h100-80g, count: 8}]}
  gpu-02: {address: 10.0.0.12, mgmt_interface: eno1, fabrics: {ib: [mlx5_0]},
           gpus: [{class: h100-80g, count: 8}]}
models:
  big:
    source: org/big
    profiles:
      - {engine: vllm, engine_version: "VERSION", gpu_class: h100-80g, nodes: 2,
         tensor_parallel: 8, pipeline_parallel: 2}
"""


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0", "0.33.0"])
def test_a_native_multi_node_profile_validates_on_every_recent_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    """Rank 1's argv ends in --headless, which vLLM 0.31 and 0.32 declare in
    vllm/entrypoints/launchers/cli_args.py: their tables must have it."""
    (tmp_path / "cluster.yaml").write_text(MULTI_NODE.replace("VERSION", version))
    assert main(["validate", "--cluster", str(tmp_path)]) == 0, capsys.readouterr().err
