"""Stand-in engine binaries for end-to-end tests, and reading back what they ran.

``tests/support/bin`` holds ``vllm`` and ``llama-server``: both run the test
engine with the argv a rendered unit gave them and record argv, environment,
pid and process group to ``$TESTENGINE_RECORD_DIR/<pid>.json``. Agents give
engines a clean environment (as systemd does), so tests put that variable in
the model's ``env`` — which also proves env files reach the engine.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

STUBS = Path(__file__).parent / "bin"

MODELS: dict[str, Any] = {
    "chat": {
        "source": "/models/chat-8b",  # a node path: sim nodes reach no hub
        "profiles": [{"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": 2,
                      "args": {"max-model-len": 8192}}],
    },
    "tiny": {
        "source": "/models/tiny.gguf",
        "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1}],
    },
}


def recording(models: dict[str, Any]) -> dict[str, Any]:
    """``models`` with the record directory (and load delay, if set) in every profile's env."""
    models = json.loads(json.dumps(models))
    for model in models.values():
        for profile in model["profiles"]:
            env = profile.setdefault("env", {})
            env["TESTENGINE_RECORD_DIR"] = os.environ["TESTENGINE_RECORD_DIR"]
            if "TESTENGINE_LOAD_DELAY" in os.environ:
                env["TESTENGINE_LOAD_DELAY"] = os.environ["TESTENGINE_LOAD_DELAY"]
    return models


def running(records: Path) -> dict[str, dict[str, Any]]:
    """Engines alive now, by served model name (the alias or --served-model-name)."""
    return {name: data for name, data in alive(records)}


def alive(records: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every engine alive now, with its served model name (duplicates included)."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(records.glob("*.json")):
        data = json.loads(path.read_text())
        if not _alive(data["pid"]):
            continue
        argv = data["argv"]
        for flag in ("--served-model-name", "--alias"):
            if flag in argv:
                found.append((argv[argv.index(flag) + 1], data))
    return found


def pids(records: Path) -> dict[str, int]:
    return {name: data["pid"] for name, data in running(records).items()}


def kill_all(records: Path, timeout: float = 10.0) -> None:
    """SIGKILL every stand-in engine alive now (each one: two replicas of a model share a
    name), and wait until each is dead: a ``Popen`` of an in-process agent that is
    collected while its engine still runs warns, and pytest fails the test on it."""
    killed = []
    for _, data in alive(records):
        try:
            os.killpg(data["pgid"], signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(int(data["pid"]))
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie does not (an orphan's parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def shippable(directory: Path) -> Path:
    """A stand-in ``llama-server`` that still works once copied elsewhere (``llmgw engine
    install`` ships it, the agent installs it under its engines directory): it answers
    ``--version`` as the install check asks, and otherwise runs the test engine by its
    absolute path. Returns the directory holding it, for PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "llama-server"
    script.write_text(
        "#!/bin/sh\n# A stand-in llama-server (tests/support/engines.py: shippable).\n"
        'if [ "$1" = "--version" ]; then echo "version: 0 (stand-in)"; exit 0; fi\n'
        f'exec python3 {STUBS.parent / "testengine.py"} "$@" '
        '--record "${TESTENGINE_RECORD_DIR:-/tmp}/$$.json" '
        '--load-delay "${TESTENGINE_LOAD_DELAY:-0.3}"\n')
    script.chmod(0o755)
    directory.chmod(0o755)
    return directory
