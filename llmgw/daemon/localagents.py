"""The local node's agent, started by the daemon when nothing answers on its socket.

``make run`` and a laptop need no agent installed: ``llmgw serve`` starts one
with the supervise backend for the node at ``address: local``. The daemon
owns that agent: when it exits it stops the agent, and the agent (with
``stop_on_exit``) stops every engine it started — nothing is left running.
An agent that was already running (a systemd service in production) is
used as it is and left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML

from llmgw.spec.models import Cluster

log = logging.getLogger(__name__)
START_TIMEOUT = 60.0


@dataclass
class LocalAgent:
    node: str
    socket: Path
    process: asyncio.subprocess.Process
    log_path: Path

    async def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM the agent (it stops its engines), SIGKILL if it does not exit in time."""
        if self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            log.warning("local agent did not stop in %.0fs; killing it", timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()


def local_node(cluster: Cluster) -> tuple[str, Path] | None:
    """The ``address: local`` node and its agent socket, if the cluster has one."""
    for name, node in cluster.nodes.items():
        if node.is_local:
            return name, Path(node.agent_socket or cluster.cluster.agent_socket)
    return None


async def answers(socket: Path) -> bool:
    """Whether something accepts connections on the unix socket."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(socket)), 2.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def ensure(cluster: Cluster) -> LocalAgent | None:
    """Start the local node's agent unless one already answers; None when not needed."""
    found = local_node(cluster)
    if found is None:
        return None
    node, socket = found
    if await answers(socket):
        log.info("local node %s: using the agent already on %s", node, socket)
        return None
    home = socket.parent
    home.mkdir(parents=True, exist_ok=True)
    config = home / "agent.yaml"
    weights = list(cluster.nodes[node].weights_dirs)
    _write_config(config, node, socket, home / "agent-state", weights)
    log_path = home / "agent.log"
    with open(log_path, "ab") as output:
        # Its own session: a Ctrl-C in the terminal reaches the daemon, which
        # then stops the agent in order (engines first) rather than all at once.
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmgw", "agent", "serve", "--config", str(config),
            stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output,
            start_new_session=True,
        )
    agent = LocalAgent(node, socket, process, log_path)
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT
    while not await answers(socket):
        if process.returncode is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-10:]
            raise RuntimeError(f"the local agent exited ({process.returncode}); its log "
                               f"({log_path}) ends:\n" + "\n".join(tail))
        if asyncio.get_running_loop().time() > deadline:
            await agent.stop()
            raise RuntimeError(f"the local agent did not open {socket} in {START_TIMEOUT:.0f}s; "
                               f"see {log_path}")
        await asyncio.sleep(0.1)
    log.info("local node %s: started an agent (pid %d) on %s", node, process.pid, socket)
    return agent


def _write_config(path: Path, node: str, socket: Path, state: Path, weights: list[str]) -> None:
    settings = {
        "node": node,
        "socket": {"path": str(socket), "mode": "0600", "group": None},
        "backend": "supervise",
        "state_dir": str(state),
        "supervise": {"stop_on_exit": True, "stop_timeout": "20s"},
        "readiness": {"poll_interval": "1s"},
        "declared": {"weights_dirs": weights},
    }
    yaml = YAML()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("# Written by `llmgw serve` for the local node; rewritten at each start.\n")
        yaml.dump(settings, handle)
