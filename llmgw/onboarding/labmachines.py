"""A lab node's agent under a real systemd: ``llmgw lab up --backend systemd``.

Each node keeps its real ``sshd`` on 127.0.0.1 (the daemon reaches it as
any node), but its agent runs as ``llmgw-agent.service`` inside a machine of
its own (:mod:`llmgw.onboarding.machines`: systemd as PID 1 of a
``systemd-nspawn`` container, sharing this host's network), so the agent's
``backend: auto`` picks systemd and every engine is a systemd unit there.
The node's directory is bound at its own path, so the agent's socket is where
sshd forwards to. The machine outlives ``lab up``; ``lab down`` powers it off
by its nspawn pid and removes its cgroups.
"""

from __future__ import annotations

import hashlib
import socket
import time
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from llmgw.onboarding import machines, processes
from llmgw.onboarding.simnodes import SimNode, agent_config

BACKENDS = ("supervise", "systemd")
AGENT_TIMEOUT = 60.0  # a fresh machine's agent imports llmgw cold, on a busy host slowly


def machine_name(runtime: Path, node: str) -> str:
    """A name unique to this lab's node on this host (labs in two directories differ)."""
    digest = hashlib.sha256(str(runtime).encode()).hexdigest()[:8]
    return f"lab-{digest}-{node}"


def settings(sim: SimNode) -> dict[str, Any]:
    """The node's agent settings: as a supervise lab node's, with the backend chosen by
    what runs it (``auto``: systemd, inside the machine)."""
    return {**agent_config(sim), "backend": "auto"}


def start(runtime: Path, sim: SimNode, engine_dir: str | None,
          shared: list[Path]) -> tuple[str, float]:
    """Boot the node's machine and its agent; its nspawn's identity, and the boot time."""
    why = machines.unavailable()
    if why is not None:
        raise machines.MachineError(f"--backend systemd: {why}")
    with sim.agent_config.open("w") as out:
        YAML().dump(settings(sim), out)
    read_only = [*machines.python_paths(), *shared]
    if engine_dir is not None:
        read_only.append(Path(engine_dir))
    machine = machines.boot(sim.root / "machine", machine_name(runtime, sim.name),
                            binds=[sim.root], read_only=sorted(set(read_only)), kept=True)
    try:
        machines.start_agent(machine, sim.agent_config,
                             [engine_dir] if engine_dir is not None else [])
        _wait_socket(sim.agent_socket, machine)
    except BaseException:
        machine.stop()
        raise
    return processes.identity(machine.process.pid), machine.booted_in


def stop(runtime: Path, node: str, identity: str) -> None:
    """Power the node's machine off (by its recorded nspawn pid) and remove what is left."""
    if identity and processes.is_same(identity):
        processes.terminate([int(identity.split()[0])])
    machines.remove(machine_name(runtime, node))


def _wait_socket(path: Path, machine: machines.Machine) -> None:
    deadline = time.monotonic() + AGENT_TIMEOUT
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(str(path))
                return
            except OSError:
                pass
        time.sleep(0.05)
    log = machine.run(["journalctl", "--unit", machines.AGENT_UNIT, "--no-pager", "-n", "20",
                       "-o", "cat"], check=False).stdout
    raise machines.MachineError(f"the agent in {machine.name} did not open {path}:\n{log}")
