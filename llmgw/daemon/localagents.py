"""The local node's agent, started by the daemon when nothing answers on its socket.

``make run`` and a laptop need no agent installed: ``llmgw serve`` starts one
with the supervise backend for the node at ``address: local``. The daemon
owns that agent:

* when the agent dies (a crash, an OOM kill, ``kill -9``) the daemon starts
  it again, with doubling backoff (1 s up to 30 s; back to 1 s once an agent
  has stayed up for a minute). The new agent re-adopts the engines the old
  one left running (their pid files are fingerprinted), so requests recover
  without a daemon restart and without restarting any engine;
* when the daemon exits it stops the agent, and the agent (with
  ``stop_on_exit``) stops every engine it started — nothing is left running.

An agent that was already running (a systemd service in production) is
used as it is and left alone: its own supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML

from llmgw.spec.models import Cluster

log = logging.getLogger(__name__)
START_TIMEOUT = 60.0
RESTART_BACKOFF = 1.0  # first delay before restarting a dead agent; doubles per failure
RESTART_BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # an agent up this long has its earlier failures forgiven


class LocalAgentError(RuntimeError):
    """The local agent could not be started; the message says where its log is."""


@dataclass
class LocalAgent:
    """The agent process this daemon started, kept alive until :meth:`stop`."""

    node: str
    socket: Path
    config: Path
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    _started_at: float = 0.0
    _stopping: bool = False
    _keeper: asyncio.Task[None] | None = field(default=None, repr=False)

    async def start(self) -> None:
        """Start the agent and wait until its socket answers; raise LocalAgentError if not."""
        loop = asyncio.get_running_loop()
        with open(self.log_path, "ab") as output:
            # Its own session: a Ctrl-C in the terminal reaches the daemon, which
            # then stops the agent in order (engines first) rather than all at once.
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llmgw", "agent", "serve", "--config", str(self.config),
                stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output,
                start_new_session=True,
            )
        self.process, self._started_at = process, loop.time()
        deadline = loop.time() + START_TIMEOUT
        while not await answers(self.socket):
            if process.returncode is not None:
                raise LocalAgentError(
                    f"the local agent exited ({_how(process.returncode)}); its log "
                    f"({self.log_path}) ends:\n" + "\n".join(self.tail()))
            if loop.time() > deadline:
                await self._terminate(process, timeout=10.0)
                raise LocalAgentError(f"the local agent did not open {self.socket} in "
                                      f"{START_TIMEOUT:.0f}s; see {self.log_path}")
            await asyncio.sleep(0.1)

    def keep_alive(self) -> None:
        """Restart the agent whenever it dies, until :meth:`stop` (runs as a task)."""
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep_alive(), name="local-agent")

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        delay = RESTART_BACKOFF
        while not self._stopping:
            assert self.process is not None
            code = await self.process.wait()
            if self._stopping:
                return
            if loop.time() - self._started_at >= STABLE_AFTER:
                delay = RESTART_BACKOFF
            log.warning("the local agent (pid %d) %s; restarting it in %.0fs (log: %s)",
                        self.process.pid, _how(code), delay, self.log_path)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_BACKOFF_MAX)
            try:
                await self.start()
            except LocalAgentError as exc:
                log.error("%s", exc)
                continue
            self.restarts += 1
            log.info("local node %s: agent restarted (pid %d, restart %d)", self.node,
                     self.process.pid, self.restarts)

    def tail(self, lines: int = 10) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return []

    async def stop(self, timeout: float = 60.0) -> None:
        """Stop restarting; SIGTERM the agent (it stops its engines), SIGKILL if it lingers."""
        self._stopping = True
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self.process is not None:
            await self._terminate(self.process, timeout)

    @staticmethod
    async def _terminate(process: asyncio.subprocess.Process, timeout: float) -> None:
        if process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            log.warning("local agent did not stop in %.0fs; killing it", timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


def _how(code: int) -> str:
    """An exit status in words: ``killed by SIGKILL``, ``exited with status 1``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


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
    """Start the local node's agent unless one already answers; None when not needed.

    The agent returned is kept alive (restarted when it dies) until its
    :meth:`LocalAgent.stop`. Raises :class:`LocalAgentError` when it cannot start.
    """
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
    agent = LocalAgent(node, socket, config, home / "agent.log")
    await agent.start()
    assert agent.process is not None
    log.info("local node %s: started an agent (pid %d) on %s", node, agent.process.pid, socket)
    agent.keep_alive()
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
