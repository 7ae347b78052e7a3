"""llama.cpp: ``llama-server``.

Flags checked against the llama.cpp server README and ``llama-server --help``
(Debian llama.cpp-tools manual page, builds b5xxx–b6xxx): ``--model FNAME``
or ``--hf-repo USER/MODEL[:QUANT]``, ``--alias``, ``--host``, ``--port``,
``--n-gpu-layers N``. The server answers ``/health`` and ``/v1/models``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.engines import flags

if TYPE_CHECKING:
    from llmgw.engines.launches import Launch

PROGRAM = ("/usr/bin/env", "llama-server")

RESERVED_FLAGS = {
    "host": "it binds each engine itself",
    "port": "it allocates ports",
    "model": "from the model's source",
    "m": "from the model's source",
    "hf-repo": "from the model's source",
    "hf": "from the model's source",
    "hfr": "from the model's source",
    "alias": "from the model's name",
    "a": "from the model's name",
    "n-gpu-layers": "from cpu / gpu_class",
    "ngl": "from cpu / gpu_class",
}


def command(launch: Launch) -> tuple[list[str], list[list[str]], dict[str, str]]:
    profile = launch.profile
    where = ["--model", launch.source] if flags.is_path(launch.source) else [
        "--hf-repo", launch.source,
    ]
    argv = [
        *PROGRAM, *where, "--alias", launch.served_name,
        "--host", launch.bind_host, "--port", str(launch.port),
        # Every layer on the GPUs it was given, or none for a CPU profile.
        "--n-gpu-layers", "0" if profile.cpu else "999",
    ]
    return [*argv, *flags.render(profile.args)], [], {}
