"""Engine command lines and environment, per engine and per multi-node mode."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llmgw.engines import flags, launches, nccl, tables
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


def multi(profile: dict[str, Any], rank: int, fabric: FabricUse = IB,
          head: str = "10.0.1.11") -> Launch:
    return launch(
        {"nodes": 2, "tensor_parallel": 2, "pipeline_parallel": 2, **profile}, rank=rank,
        port=18000 if rank == 0 else None, head_address=head, dist_port=18001,
        mgmt_interface="eno1", fabric=fabric, gpu_indices=(2, 3),
        host_ip=head if rank == 0 else "10.0.1.12", aux_port=None if rank == 0 else 18002,
    )


@pytest.mark.parametrize(
    ("name", "the_launch", "argv"),
    [
        ("vllm single node", launch(
            {"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": 2,
             "dtype": "bfloat16", "args": {"max-model-len": 8192, "enforce-eager": True,
                                           "enable-prefix-caching": False, "seed": None}},
            download_dir="/models"),
         ["/usr/bin/env", "vllm", "serve", "org/model", "--served-model-name", "m",
          "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1", "--dtype", "bfloat16",
          "--download-dir", "/models", "--host", "0.0.0.0", "--port", "18000",
          "--no-enable-prefix-caching", "--enforce-eager", "--max-model-len", "8192"]),
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
         ["/usr/bin/env", "ray", "start", "--block", "--address", "10.0.1.11:18001",
          "--min-worker-port", "20000", "--max-worker-port", "29999",
          "--node-ip-address", "10.0.1.12"]),
        ("sglang rank 0", multi({"engine": "sglang", "gpu_class": "h100-80g"}, 0),
         ["/usr/bin/env", "python3", "-m", "sglang.launch_server", "--model-path", "org/model",
          "--served-model-name", "m", "--tp-size", "2", "--pp-size", "2", "--nnodes", "2",
          "--node-rank", "0", "--dist-init-addr", "10.0.1.11:18001",
          "--host", "0.0.0.0", "--port", "18000", "--enable-metrics"]),
        ("sglang rank 1", multi({"engine": "sglang", "gpu_class": "h100-80g"}, 1),
         ["/usr/bin/env", "python3", "-m", "sglang.launch_server", "--model-path", "org/model",
          "--served-model-name", "m", "--tp-size", "2", "--pp-size", "2", "--nnodes", "2",
          "--node-rank", "1", "--dist-init-addr", "10.0.1.11:18001",
          "--host", "127.0.0.1", "--port", "18002"]),
        ("llama.cpp on cpu", launch(
            {"engine": "llama.cpp", "cpu": True, "min_memory_gb": 8,
             "args": {"parallel": 2, "fa": "on", "threads": 16.0, "jinja": False}},
            source="/models/gemma.gguf", gpu_uuids=(), bind_host="127.0.0.1"),
         ["/usr/bin/env", "llama-server", "--model", "/models/gemma.gguf", "--alias", "m",
          "--host", "127.0.0.1", "--port", "18000", "--n-gpu-layers", "0", "--metrics",
          "-fa", "on", "--no-jinja", "--parallel", "2", "--threads", "16"]),
        ("llama.cpp from a hub repo on a gpu", launch(
            {"engine": "llama.cpp", "gpu_class": "l4-22g"}, source="ggml-org/gemma-3-1b-it-GGUF"),
         ["/usr/bin/env", "llama-server", "--hf-repo", "ggml-org/gemma-3-1b-it-GGUF",
          "--alias", "m", "--host", "0.0.0.0", "--port", "18000", "--n-gpu-layers", "999",
          "--metrics"]),
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
        "--include-dashboard=false", "--min-worker-port", "20000", "--max-worker-port", "29999",
        "--node-ip-address", "10.0.1.11",
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


def test_roce_gets_its_gid_index_only_when_known() -> None:
    env = dict(launches.command(multi({"engine": "vllm", "gpu_class": "a100-80g"}, 0,
                                      fabric=ROCE)).env)
    assert env["NCCL_IB_HCA"] == "=mlx5_2"
    assert env["NCCL_IB_GID_INDEX"] == "5"
    # Nothing declared or found: NCCL's own selection, not a guessed index.
    unknown = FabricUse("roce-a", "roce", ("mlx5_2",))
    assert "NCCL_IB_GID_INDEX" not in nccl.environment(unknown, "eno1", True)


@pytest.mark.parametrize(("engine", "variable"),
                         [("vllm", "VLLM_HOST_IP"), ("sglang", "SGLANG_HOST_IP")])
@pytest.mark.parametrize("rank", [0, 1])
def test_multi_node_shards_announce_their_management_address(
    engine: str, variable: str, rank: int
) -> None:
    env = dict(launches.command(multi({"engine": engine, "gpu_class": "h100-80g"}, rank)).env)
    assert env[variable] == ("10.0.1.11" if rank == 0 else "10.0.1.12")
    single = dict(launches.command(launch({"engine": engine, "gpu_class": "h100-80g"},
                                          host_ip="10.0.1.11")).env)
    assert variable not in single


@pytest.mark.parametrize(
    ("engine", "version", "expected"),
    [
        ("vllm", None, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}),
        ("vllm", "0.24.0", {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}),
        # vLLM ≤ 0.23 calls int() on each entry: indices, in nvidia-smi's order.
        ("vllm", "0.23.0", {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        ("vllm", "0.11.2", {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        # SGLang's custom all-reduce does the same, in every version.
        ("sglang", None, {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        ("llama.cpp", None, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}),
    ],
)
def test_gpus_are_pinned_by_uuid_only_where_the_engine_version_accepts_it(
    engine: str, version: str | None, expected: dict[str, str]
) -> None:
    profile = {"engine": engine, "gpu_class": "h100-80g", "engine_version": version}
    env = dict(launches.command(launch(profile, gpu_indices=(2, 3))).env)
    assert env == expected


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_ipv6_head_addresses_are_bracketed(engine: str) -> None:
    profile = {"engine": engine, "gpu_class": "h100-80g", "multi_node": "ray"} \
        if engine == "vllm" else {"engine": engine, "gpu_class": "h100-80g"}
    head = launches.command(multi(profile, 0, head="fd00::11"))
    follower = launches.command(multi(profile, 1, head="fd00::11"))
    if engine == "vllm":
        assert dict(head.env)["RAY_ADDRESS"] == "[fd00::11]:18001"
        assert follower.argv[follower.argv.index("--address") + 1] == "[fd00::11]:18001"
        assert head.prelude[0][-2:] == ("--node-ip-address", "fd00::11")
    else:
        for command in (head, follower):
            at = command.argv.index("--dist-init-addr")
            assert command.argv[at + 1] == "[fd00::11]:18001"
    native = launches.command(multi({"engine": "vllm", "gpu_class": "h100-80g"}, 1,
                                    head="fd00::11"))
    # --master-addr is an address on its own: no brackets, no port.
    assert native.argv[native.argv.index("--master-addr") + 1] == "fd00::11"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_single_node_gets_no_fabric_variables(engine: str) -> None:
    env = dict(launches.command(launch({"engine": engine, "gpu_class": "h100-80g"},
                                       mgmt_interface="eno1", fabric=IB)).env)
    assert not {k for k in env if k.startswith(("NCCL_", "GLOO_"))}


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


VLLM = tables.load("vllm", "0.33.0")
LLAMA = tables.load("llama.cpp", "11434.0.0")


@pytest.mark.parametrize(
    ("args", "table", "rendered"),
    [
        ({"seed": 1, "enforce-eager": True, "none": None}, VLLM,
         ["--enforce-eager", "--seed", "1"]),
        ({"gpu-memory-utilization": 0.92, "max-model-len": 8192.0}, VLLM,
         ["--gpu-memory-utilization", "0.92", "--max-model-len", "8192"]),
        ({"--already-dashed": "x", "chat-template": "gemma"}, VLLM,
         ["--already-dashed", "x", "--chat-template", "gemma"]),
        # false is the engine's own negation, not silence.
        ({"enable-prefix-caching": False}, VLLM, ["--no-enable-prefix-caching"]),
        ({"jinja": False, "mmap": None}, LLAMA, ["--no-jinja"]),
        # One dash exactly where the engine defines the option so.
        ({"fa": "on", "ngl": 10, "c": 4096}, LLAMA, ["-c", "4096", "-fa", "on", "-ngl", "10"]),
        # Unchecked: written as they are, two dashes for a word.
        ({"fa": "on", "x": 1}, None, ["--fa", "on", "-x", "1"]),
    ],
)
def test_flags(args: dict[str, Any], table: tables.Table | None, rendered: list[str]) -> None:
    result = flags.render(args, table)
    assert (result.argv, result.problems) == (rendered, [])


@pytest.mark.parametrize(
    ("args", "table", "problem"),
    [
        ({"disable-log-stats": False}, VLLM,
         "args.disable-log-stats: false would need --no-disable-log-stats, but vLLM 0.33.0 "
         "defines no --no-disable-log-stats; remove the key to keep the engine's default"),
        ({"new-flag": False}, None,
         "args.new-flag: false would need --no-new-flag, but unchecked flags are written as "
         "they are; remove the key to keep the engine's default"),
    ],
)
def test_false_without_a_negation_is_an_error(
    args: dict[str, Any], table: tables.Table | None, problem: str
) -> None:
    result = flags.render(args, table)
    assert result.argv == [] and [m for _, m in result.problems] == [problem]


def vllm_profile(**fields: Any) -> Profile:
    return Profile.model_validate({"engine": "vllm", "gpu_class": "h100-80g", **fields})


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        ({"args": {"task": "embed"}}, ("args", "task"),
         "args.task: `task` was removed in vLLM 0.13; use `runner: pooling`"),
        ({"args": {"task": "embed"}, "engine_version": "0.31.0"}, ("args", "task"),
         "args.task: `task` was removed in vLLM 0.13; use `runner: pooling`"),
        ({"args": {"runner": "bogus"}}, ("args", "runner"),
         "args.runner: --runner 'bogus' is not one of vLLM 0.33.0's choices: auto, draft, "
         "generate, pooling"),
        ({"args": {"no-such-flag": 1}}, ("args", "no-such-flag"),
         "args.no-such-flag: vLLM 0.33.0 has no option --no-such-flag; a flag newer than "
         "llmgw's table goes under unchecked_args"),
        ({"args": {"enforce-eager": "yes"}}, ("args", "enforce-eager"),
         "args.enforce-eager: --enforce-eager takes no value in vLLM 0.33.0"),
        ({"args": {"max-model-len": True}}, ("args", "max-model-len"),
         "args.max-model-len: --max-model-len needs a value in vLLM 0.33.0"),
        ({"engine_version": "0.9.2"}, ("engine_version",),
         "vLLM 0.9.2 is older than every flag table llmgw has"),
        ({"nodes": 2, "tensor_parallel": 8, "pipeline_parallel": 2, "engine_version": "0.11.2",
          "kv_cache_dtype": "bogus"}, ("engine_version",),
         "llmgw renders --kv-cache-dtype, but --kv-cache-dtype 'bogus' is not one of"),
    ],
)
def test_argv_is_checked_against_the_engine_version_table(
    fields: dict[str, Any], where: tuple[str, ...], message: str
) -> None:
    found = launches.findings(vllm_profile(**fields))
    assert [(f.where, f.message[:len(message)]) for f in found] == [(where, message)]


def test_vllm_takes_one_key_of_a_json_config_option() -> None:
    assert launches.findings(vllm_profile(args={"compilation-config.mode": 3})) == []
    [finding] = launches.findings(vllm_profile(args={"no-such-config.mode": 3}))
    assert finding.where == ("args", "no-such-config.mode")


def test_task_is_fine_where_the_version_still_has_it() -> None:
    assert launches.findings(vllm_profile(args={"task": "embed"}, engine_version="0.12.0")) == []
    assert launches.findings(vllm_profile(args={"runner": "pooling"})) == []


def test_unchecked_args_are_the_escape_hatch_for_newer_flags() -> None:
    profile = vllm_profile(args={"max-model-len": 8192},
                           unchecked_args={"flag-from-the-future": 3, "shiny": True})
    assert launches.findings(profile) == []
    argv = launches.command(launch(profile.model_dump())).argv
    assert argv[-5:] == ("--max-model-len", "8192", "--flag-from-the-future", "3", "--shiny")


def test_sglang_tp_is_the_defined_flag_in_every_table() -> None:
    for version in tables.available("sglang"):
        table = tables.load("sglang", version)
        assert "--tp-size" in table.options and "--tp" not in table.options, version


def test_fp8_is_not_a_dtype() -> None:
    with pytest.raises(ValidationError, match="use `quantization: fp8`"):
        vllm_profile(dtype="fp8")
    assert vllm_profile(quantization="fp8", kv_cache_dtype="fp8").dtype is None
