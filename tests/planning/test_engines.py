"""Engine command lines and environment, per engine and per multi-node mode."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.engines import flags, launches, nccl
from llmgw.engines.launches import EngineError, FabricUse, Launch
from llmgw.spec.models import Profile

UUIDS = ("GPU-aaaa", "GPU-bbbb")
IB = FabricUse("ib-a", "infiniband", ("mlx5_0", "mlx5_1"))
ROCE = FabricUse("roce-a", "roce", ("mlx5_2",), gid_index=5)


def launch(profile: dict[str, Any], **overrides: Any) -> Launch:
    values: dict[str, Any] = {
        "model": "m", "served_name": "m", "source": "org/model",
        "profile": Profile.model_validate(profile), "rank": 0, "bind_host": "0.0.0.0",
        "port": 18000, "gpu_uuids": UUIDS,
    }
    values.update(overrides)
    return Launch(**values)


def multi(profile: dict[str, Any], rank: int, fabric: FabricUse = IB) -> Launch:
    return launch(
        {"nodes": 2, "tensor_parallel": 2, "pipeline_parallel": 2, **profile}, rank=rank,
        port=18000 if rank == 0 else None, head_address="10.0.1.11", dist_port=18001,
        mgmt_interface="eno1", fabric=fabric,
    )


@pytest.mark.parametrize(
    ("name", "the_launch", "argv"),
    [
        ("vllm single node", launch(
            {"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": 2,
             "dtype": "bfloat16", "args": {"max-model-len": 8192, "enforce-eager": True,
                                           "disable-log-stats": False}},
            download_dir="/models"),
         ["/usr/bin/env", "vllm", "serve", "org/model", "--served-model-name", "m",
          "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1", "--dtype", "bfloat16",
          "--download-dir", "/models", "--host", "0.0.0.0", "--port", "18000",
          "--enforce-eager", "--max-model-len", "8192"]),
        ("vllm native rank 0", multi({"engine": "vllm", "gpu_class": "h100-80g"}, 0),
         ["/usr/bin/env", "vllm", "serve", "org/model", "--served-model-name", "m",
          "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
          "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "0",
          "--master-addr", "10.0.1.11", "--master-port", "18001",
          "--host", "0.0.0.0", "--port", "18000"]),
        ("vllm native rank 1", multi({"engine": "vllm", "gpu_class": "h100-80g"}, 1),
         ["/usr/bin/env", "vllm", "serve", "org/model", "--served-model-name", "m",
          "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
          "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "1",
          "--master-addr", "10.0.1.11", "--master-port", "18001", "--headless"]),
        ("vllm ray head", multi({"engine": "vllm", "gpu_class": "h100-80g",
                                 "multi_node": "ray"}, 0),
         ["/usr/bin/env", "vllm", "serve", "org/model", "--served-model-name", "m",
          "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
          "--distributed-executor-backend", "ray", "--host", "0.0.0.0", "--port", "18000"]),
        ("vllm ray worker", multi({"engine": "vllm", "gpu_class": "h100-80g",
                                   "multi_node": "ray"}, 1),
         ["/usr/bin/env", "ray", "start", "--block", "--address", "10.0.1.11:18001"]),
        ("sglang rank 0", multi({"engine": "sglang", "gpu_class": "h100-80g"}, 0),
         ["/usr/bin/env", "python3", "-m", "sglang.launch_server", "--model-path", "org/model",
          "--served-model-name", "m", "--tp", "2", "--pp-size", "2", "--nnodes", "2",
          "--node-rank", "0", "--dist-init-addr", "10.0.1.11:18001",
          "--host", "0.0.0.0", "--port", "18000"]),
        ("sglang rank 1", multi({"engine": "sglang", "gpu_class": "h100-80g"}, 1),
         ["/usr/bin/env", "python3", "-m", "sglang.launch_server", "--model-path", "org/model",
          "--served-model-name", "m", "--tp", "2", "--pp-size", "2", "--nnodes", "2",
          "--node-rank", "1", "--dist-init-addr", "10.0.1.11:18001"]),
        ("llama.cpp on cpu", launch(
            {"engine": "llama.cpp", "cpu": True, "min_memory_gb": 8,
             "args": {"ctx-size": 8192, "c": 2, "threads": 16.0}},
            source="/models/gemma.gguf", gpu_uuids=(), bind_host="127.0.0.1"),
         ["/usr/bin/env", "llama-server", "--model", "/models/gemma.gguf", "--alias", "m",
          "--host", "127.0.0.1", "--port", "18000", "--n-gpu-layers", "0",
          "-c", "2", "--ctx-size", "8192", "--threads", "16"]),
        ("llama.cpp from a hub repo on a gpu", launch(
            {"engine": "llama.cpp", "gpu_class": "l4-22g"}, source="ggml-org/gemma-3-1b-it-GGUF"),
         ["/usr/bin/env", "llama-server", "--hf-repo", "ggml-org/gemma-3-1b-it-GGUF",
          "--alias", "m", "--host", "0.0.0.0", "--port", "18000", "--n-gpu-layers", "999"]),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_argv(name: str, the_launch: Launch, argv: list[str]) -> None:
    assert list(launches.command(the_launch).argv) == argv, name


def test_ray_head_starts_ray_first_and_names_its_cluster() -> None:
    command = launches.command(multi({"engine": "vllm", "gpu_class": "h100-80g",
                                      "multi_node": "ray"}, 0))
    assert command.prelude == ((
        "/usr/bin/env", "ray", "start", "--head", "--port", "18001",
        "--include-dashboard=false", "--node-ip-address", "10.0.1.11",
    ),)
    assert dict(command.env)["RAY_ADDRESS"] == "10.0.1.11:18001"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("rank", [0, 1])
def test_infiniband_environment(engine: str, rank: int) -> None:
    env = dict(launches.command(multi({"engine": engine, "gpu_class": "h100-80g"}, rank)).env)
    assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert env["NCCL_SOCKET_IFNAME"] == "=eno1"
    assert env["GLOO_SOCKET_IFNAME"] == "eno1"
    assert "NCCL_IB_GID_INDEX" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"


def test_roce_gets_its_gid_index() -> None:
    env = dict(launches.command(multi({"engine": "vllm", "gpu_class": "a100-80g"}, 0,
                                      fabric=ROCE)).env)
    assert env["NCCL_IB_HCA"] == "=mlx5_2"
    assert env["NCCL_IB_GID_INDEX"] == "5"
    default = FabricUse("roce-a", "roce", ("mlx5_2",))
    assert nccl.environment(default, "eno1", True)["NCCL_IB_GID_INDEX"] == "3"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_single_node_gets_no_fabric_variables(engine: str) -> None:
    env = dict(launches.command(launch({"engine": engine, "gpu_class": "h100-80g"},
                                       mgmt_interface="eno1", fabric=IB)).env)
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}


def test_cpu_profile_hides_every_gpu() -> None:
    env = dict(launches.command(launch({"engine": "llama.cpp", "cpu": True},
                                       gpu_uuids=(), source="/m.gguf")).env)
    assert env == {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize(
    ("profile", "problem"),
    [
        ({"engine": "vllm", "gpu_class": "h100-80g", "args": {"port": 1}},
         "args.port is set by llmgw (it allocates ports); remove it"),
        ({"engine": "vllm", "gpu_class": "h100-80g", "args": {"--tensor-parallel-size": 4}},
         "args.--tensor-parallel-size is set by llmgw (from tensor_parallel); remove it"),
        ({"engine": "sglang", "gpu_class": "h100-80g", "args": {"dist-init-addr": "x:1"}},
         "args.dist-init-addr is set by llmgw (from the placement); remove it"),
        ({"engine": "vllm", "gpu_class": "h100-80g", "env": {"NCCL_IB_HCA": "mlx5"}},
         "env.NCCL_IB_HCA is set by llmgw from the placement (GPUs, fabric); remove it"),
        # A bad variable name (BAD-NAME) never gets here: the spec refuses it
        # (tests/spec/broken/hostile-identifiers).
        ({"engine": "vllm", "gpu_class": "h100-80g", "env": {"A": "two\nlines"}},
         "env.A spans lines; a unit's environment holds one line per variable"),
        ({"engine": "llama.cpp", "cpu": True, "quantization": "awq"},
         "quantization does not apply to llama.cpp (a GGUF file carries its own "
         "quantization); pass llama-server flags under args"),
        ({"engine": "llama.cpp", "gpu_class": "l4-22g", "nodes": 2, "tensor_parallel": 2},
         "llama.cpp runs on one node; set nodes: 1"),
    ],
)
def test_profiles_the_engine_cannot_express(profile: dict[str, Any], problem: str) -> None:
    parsed = Profile.model_validate(profile)
    assert launches.problems(parsed) == [problem]
    with pytest.raises(EngineError, match="remove it|valid|spans|apply|one node"):
        launches.command(launch(profile))


@pytest.mark.parametrize(
    ("args", "rendered"),
    [
        ({"b": 1, "a-flag": True, "off": False, "none": None}, ["--a-flag", "-b", "1"]),
        ({"gpu-memory-utilization": 0.92, "max-model-len": 8192.0},
         ["--gpu-memory-utilization", "0.92", "--max-model-len", "8192"]),
        ({"--already-dashed": "x", "chat-template": "gemma"},
         ["--already-dashed", "x", "--chat-template", "gemma"]),
    ],
)
def test_flags(args: dict[str, Any], rendered: list[str]) -> None:
    assert flags.render(args) == rendered
