"""vLLM: ``vllm serve``, alone or across nodes (Ray, or vLLM's own launcher).

Flags checked against the vLLM documentation:

* ``vllm serve <model> --host --port --served-model-name --tensor-parallel-size
  --pipeline-parallel-size --dtype --quantization --kv-cache-dtype
  --download-dir --distributed-executor-backend`` — engine arguments, vLLM
  0.10.x and later (docs.vllm.ai, "Engine Arguments").
* Multi-node without Ray: ``--nnodes N --node-rank R --master-addr A
  --master-port P``, and ``--headless`` on every rank but 0 (docs/serving/
  parallelism_scaling.md, "Running vLLM with MultiProcessing"; vLLM 0.11.1+,
  the 0.10 ``ParallelConfig`` has no ``nnodes``).
* Multi-node with Ray: ``ray start --head --port P`` on rank 0 and ``ray
  start --block --address A:P`` on the others, then ``vllm serve ...
  --distributed-executor-backend ray`` on the head (same page, "Running vLLM on
  a Ray cluster"; examples/online_serving/multi-node-serving.sh).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from llmgw.engines import addresses, flags
from llmgw.engines.parts import Parts

if TYPE_CHECKING:
    from llmgw.engines.launches import Launch
    from llmgw.engines.tables import Selection

PROGRAM = ("/usr/bin/env", "vllm")
RAY = ("/usr/bin/env", "ray")
HOST_IP_ENV = "VLLM_HOST_IP"
# CUDA_VISIBLE_DEVICES may hold GPU UUIDs from this release on; earlier ones
# call int() on every entry at start-up (vllm/platforms/cuda.py).
UUID_DEVICES_SINCE = "0.24.0"
# Ray's own worker processes (one port each): below the ephemeral range, above
# the engine ports llmgw allocates from 18000.
RAY_WORKER_PORTS = (20000, 29999)

# Flags vLLM's CPU backend overrides or ignores (vllm/platforms/cpu.py,
# vllm/v1/worker/cpu_worker.py, 0.32): on a `cpu: true` profile each is an
# error at its key, so that nobody believes it is in force.
GPU_ONLY_FLAGS = {
    "cudagraph-capture-sizes": "the CPU backend captures no CUDA graphs (it clears the sizes)",
    "max-cudagraph-capture-size": "the CPU backend captures no CUDA graphs",
    "enable-dbo": "dual-batch overlap is not supported on CPU (vLLM turns it off)",
    "disable-custom-all-reduce": "the custom all-reduce is a CUDA kernel; on CPU it is always off",
    "async-scheduling": "the CPU backend always schedules synchronously",
}
# On CPU, --gpu-memory-utilization (default 0.92) is the fraction of the node's
# whole memory vLLM reserves, and it refuses to start when less is free; an
# explicit KV cache size skips that check. Either of these says one.
CPU_KV_CACHE_FLAG = "kv-cache-memory-bytes"
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# vLLM's CPU backend binds its worker's threads by default ("auto"): to the cores
# of the first NUMA node it may use, less one reserved core, whatever else runs
# there. Two replicas on one node (a replace starts the new one beside the old)
# then share the same cores while the rest sit idle, and on this project's test
# machines the second one's sched_setaffinity never returned. Until llmgw splits
# a node's cores between replicas, a CPU profile leaves placement to the kernel;
# a profile's own env.VLLM_CPU_OMP_THREADS_BIND (a core list) overrides it.
CPU_THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
CPU_THREADS_BIND_DEFAULT = "nobind"

RESERVED_FLAGS = {
    "host": "it binds each engine itself",
    "port": "it allocates ports",
    "model": "from the model's source",
    "served-model-name": "from the model's name",
    "tensor-parallel-size": "from tensor_parallel",
    "tp": "from tensor_parallel",
    "pipeline-parallel-size": "from pipeline_parallel",
    "pp": "from pipeline_parallel",
    "dtype": "from the profile's dtype",
    "quantization": "from the profile's quantization",
    "kv-cache-dtype": "from the profile's kv_cache_dtype",
    "distributed-executor-backend": "from multi_node",
    "nnodes": "from nodes",
    "node-rank": "from the placement",
    "master-addr": "from the placement",
    "master-port": "it allocates ports",
    "headless": "from the placement",
}
# Set from the model's adapters, when it declares any.
ADAPTER_FLAGS = ("enable-lora", "lora-modules", "max-lora-rank")


def command(launch: Launch, selection: Selection) -> Parts:
    profile = launch.profile
    serve = [*PROGRAM, "serve", launch.source]
    options = ["--served-model-name", launch.served_name,
               "--tensor-parallel-size", str(profile.tensor_parallel),
               "--pipeline-parallel-size", str(profile.pipeline_parallel)]
    for name, setting in (
        ("--dtype", profile.dtype),
        ("--quantization", profile.quantization),
        ("--kv-cache-dtype", profile.kv_cache_dtype),
    ):
        if setting:
            options += [name, setting]
    if launch.download_dir and not flags.is_path(launch.source):
        options += ["--download-dir", launch.download_dir]
    listen = ["--host", launch.bind_host, "--port", str(launch.port)]
    start = len(serve)
    loras = flags.adapter_options(launch.adapters, "--lora-modules")

    if not launch.multi_node:
        return Parts([*serve, *options, *listen], options_from=start, multi=loras)

    head = addresses.host_port(str(launch.head_address), launch.dist_port)
    if profile.multi_node == "native":
        dist = [
            "--distributed-executor-backend", "mp",
            "--nnodes", str(profile.nodes),
            "--node-rank", str(launch.rank),
            "--master-addr", str(launch.head_address),
            "--master-port", str(launch.dist_port),
        ]
        tail = listen if launch.rank == 0 else ["--headless"]
        return Parts([*serve, *options, *dist, *tail], options_from=start, multi=loras)

    # Ray: rank 0 starts the Ray head, then vLLM on it; the others join and block.
    # Ray's workers take ports from 10002-19999 by default, across llmgw's engine
    # ports (18000 up): move them to their own range on every node.
    workers = ["--min-worker-port", str(RAY_WORKER_PORTS[0]),
               "--max-worker-port", str(RAY_WORKER_PORTS[1])]
    if launch.rank != 0:
        join = [*RAY, "start", "--block", "--address", head, *workers]
        if launch.host_ip:
            join += ["--node-ip-address", launch.host_ip]
        return Parts(join, takes_args=False)
    start_head = [
        *RAY, "start", "--head", "--port", str(launch.dist_port),
        # The dashboard's fixed port would collide with a second Ray head on this node.
        "--include-dashboard=false", *workers,
    ]
    if _is_ip(launch.head_address):
        start_head += ["--node-ip-address", str(launch.head_address)]
    argv = [*serve, *options, "--distributed-executor-backend", "ray", *listen]
    # Name the cluster explicitly: with two Ray heads on one node, "auto"
    # discovery would pick whichever started last.
    return Parts(argv, [start_head], {"RAY_ADDRESS": head}, options_from=start, multi=loras)


def _is_ip(address: str | None) -> bool:
    try:
        ipaddress.ip_address(address or "")
    except ValueError:
        return False
    return True
