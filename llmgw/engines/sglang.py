"""SGLang: ``python3 -m sglang.launch_server``.

Flags checked against the SGLang documentation (docs.sglang.io, "Server
Arguments" and "Multi-Node Deployment", SGLang 0.4.x–0.5.x): ``--model-path
--served-model-name --host --port --tp --pp-size --dtype --quantization
--kv-cache-dtype --download-dir``; across nodes ``--nnodes N --node-rank R
--dist-init-addr HOST:PORT``, where ``--tp`` is the tensor-parallel size over
all nodes and only rank 0 serves HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.engines import flags

if TYPE_CHECKING:
    from llmgw.engines.launches import Launch

PROGRAM = ("/usr/bin/env", "python3", "-m", "sglang.launch_server")

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


def command(launch: Launch) -> tuple[list[str], list[list[str]], dict[str, str]]:
    profile = launch.profile
    argv = [
        *PROGRAM, "--model-path", launch.source, "--served-model-name", launch.served_name,
        "--tp", str(profile.tensor_parallel),
    ]
    if profile.pipeline_parallel > 1:
        # Older releases lack --pp-size; leave it out where it would be 1 anyway.
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
            "--dist-init-addr", f"{launch.head_address}:{launch.dist_port}",
        ]
    if launch.rank == 0:
        argv += ["--host", launch.bind_host, "--port", str(launch.port)]
    return [*argv, *flags.render(profile.args)], [], {}
