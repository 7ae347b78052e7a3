"""SGLang: ``python3 -m sglang.launch_server``.

Options as SGLang's own ``ServerArgs`` declares them (checked against the flag
tables, :mod:`.tables`): ``--model-path --served-model-name --host --port
--tp-size --pp-size --dtype --quantization --kv-cache-dtype --download-dir``, and on
rank 0 ``--enable-metrics`` (the agent reads its load from ``/metrics``);
across nodes ``--nnodes N --node-rank R --dist-init-addr HOST:PORT``, where
``--tp-size`` is the tensor-parallel size over all nodes and only rank 0
serves the API. (``--tp`` is not a defined option: it only ever worked through
argparse's prefix matching, which breaks as soon as a second ``--tp…`` option
appears.)

Ranks above 0 still start a placeholder health server on their ``--host``
and ``--port`` (``launch_dummy_health_check_server`` in
``sglang/srt/entrypoints/engine.py``), by default 127.0.0.1:30000: a second
such shard on one node would fail to bind. Each gets its own port from the
planner (``aux_port``), on loopback since nothing outside needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.engines import addresses, flags
from llmgw.engines.parts import Parts

if TYPE_CHECKING:
    from llmgw.engines.launches import Launch
    from llmgw.engines.tables import Selection

PROGRAM = ("/usr/bin/env", "python3", "-m", "sglang.launch_server")
HOST_IP_ENV = "SGLANG_HOST_IP"

RESERVED_FLAGS = {
    "host": "it binds each engine itself",
    "port": "it allocates ports",
    "model-path": "from the model's source",
    "model": "from the model's source",
    "served-model-name": "from the model's name",
    "tp": "from tensor_parallel",
    "tp-size": "from tensor_parallel",
    "tensor-parallel-size": "from tensor_parallel",
    "pp-size": "from pipeline_parallel",
    "pipeline-parallel-size": "from pipeline_parallel",
    "dtype": "from the profile's dtype",
    "quantization": "from the profile's quantization",
    "kv-cache-dtype": "from the profile's kv_cache_dtype",
    "nnodes": "from nodes",
    "node-rank": "from the placement",
    "dist-init-addr": "from the placement",
}
# Set from the model's adapters, when it declares any. A request names one as
# `base:adapter` in its `model` (SGLang's OpenAI-compatible form; llmgw.router.loras).
ADAPTER_FLAGS = ("enable-lora", "lora-paths", "max-lora-rank")


def command(launch: Launch, selection: Selection) -> Parts:
    profile = launch.profile
    argv = [
        *PROGRAM, "--model-path", launch.source, "--served-model-name", launch.served_name,
        "--tp-size", str(profile.tensor_parallel),
    ]
    if profile.pipeline_parallel > 1:
        argv += ["--pp-size", str(profile.pipeline_parallel)]
    for name, setting in (
        ("--dtype", profile.dtype),
        ("--quantization", profile.quantization),
        ("--kv-cache-dtype", profile.kv_cache_dtype),
    ):
        if setting:
            argv += [name, setting]
    if launch.download_dir and not flags.is_path(launch.source):
        argv += ["--download-dir", launch.download_dir]
    if launch.multi_node:
        argv += [
            "--nnodes", str(profile.nodes),
            "--node-rank", str(launch.rank),
            "--dist-init-addr", addresses.host_port(str(launch.head_address), launch.dist_port),
        ]
    if launch.rank == 0:
        # /metrics: the agent reads the engine's load from it (llmgw.agent.scrapes).
        argv += ["--host", launch.bind_host, "--port", str(launch.port), "--enable-metrics"]
    elif launch.aux_port is not None:
        argv += ["--host", "127.0.0.1", "--port", str(launch.aux_port)]
    return Parts(argv, options_from=len(PROGRAM),
                 multi=flags.adapter_options(launch.adapters, "--lora-paths"))
