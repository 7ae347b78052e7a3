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
  ``stop_on_exit``) stops every engine it started. Then the daemon stops
  what the agent did not: engines recorded in the agent's state directory
  that still run (the agent had died, or was killed after the stop
  timeout) are adopted by fingerprint and stopped — nothing is left running.
  A second signal to the daemon makes this immediate (:meth:`LocalAgent.stop`
  with ``hurry``): the agent is asked again (it SIGKILLs its engines), and
  whatever still runs a moment later is SIGKILLed by the daemon.

An agent that was already running (a systemd service in production) is
used as it is and left alone, with its engines: its own supervisor
restarts it, and engines outlive agents by design (upgrades).

The agent runs ``python -P -m llmgw`` in its own directory (the socket's),
so a ``llmgw.py`` or ``llmgw/`` in the daemon's working directory is never
what runs.
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

from llmgw.agent.settings import SuperviseSettings
from llmgw.agent.supervisors import Supervisor
from llmgw.spec.models import Cluster

log = logging.getLogger(__name__)
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0  # SIGTERM → SIGKILL for the agent (its engines get ENGINE_STOP each)
ENGINE_STOP = 20.0  # the engines' SIGTERM → SIGKILL, in the agent and in the daemon's sweep
HURRIED = 3.0  # after a second signal: how long the agent gets before SIGKILL
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
    state_dir: Path
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
            # -P and its own directory: the daemon's working directory is not on its
            # sys.path, so a llmgw.py or llmgw/ there never runs instead of llmgw.
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", "llmgw", "agent", "serve",
                "--config", str(self.config),
                stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output,
                start_new_session=True, cwd=self.socket.parent,
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

    async def stop(self, timeout: float = STOP_TIMEOUT,
                   hurry: asyncio.Event | None = None) -> None:
        """Stop restarting; stop the agent (it stops its engines), then any engine it left.

        SIGTERM, and SIGKILL to its group after ``timeout``. When ``hurry`` is
        set (a second signal), at once: the agent gets a second SIGTERM, which
        makes it SIGKILL its engines, and :data:`HURRIED` seconds later
        whatever remains is SIGKILLed from here.
        """
        self._stopping = True
        hurry = hurry or asyncio.Event()
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        lingered = False
        if self.process is not None and self.process.returncode is None:
            lingered = not await self._terminate(self.process, timeout, hurry)
        # Engines of an agent killed for lingering had their SIGTERM and their time.
        await self._sweep(hurry, at_once=lingered)

    async def _sweep(self, hurry: asyncio.Event, at_once: bool = False) -> None:
        """Stop the engines recorded in the agent's state that still run.

        The agent stops its engines when it exits (``stop_on_exit``); this is for
        the ones it could not: it had died (the daemon was stopped while
        restarting it), or it was killed mid-stop. A recorded engine is adopted
        only when its fingerprint still matches (a reused pid is never signalled).
        """
        if not (self.state_dir / "units").is_dir():
            return
        supervisor = Supervisor(self.state_dir, SuperviseSettings(
            stop_on_exit=True, stop_timeout=ENGINE_STOP))
        left = supervisor.running()
        if not left:
            return
        log.warning("the local agent left %s running: stopping %s",
                    ", ".join(left), "them" if len(left) > 1 else "it")
        if at_once or hurry.is_set():
            supervisor.hurry()
        closing = asyncio.ensure_future(supervisor.close())
        waiter = asyncio.ensure_future(hurry.wait())
        try:
            await asyncio.wait({closing, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not closing.done():
                supervisor.hurry()
            await closing
        finally:
            waiter.cancel()

    @staticmethod
    async def _terminate(process: asyncio.subprocess.Process, timeout: float,
                         hurry: asyncio.Event | None = None) -> bool:
        """SIGTERM ``process``; True when it exited by itself, False when it was SIGKILLed."""
        if process.returncode is not None:
            return True
        hurry = hurry or asyncio.Event()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        if await _exits(process, timeout, hurry):
            return True
        if hurry.is_set():
            log.warning("stopping the local agent at once")
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)  # the second: it kills its engines
            if await _exits(process, HURRIED, asyncio.Event()):
                return True
        else:
            log.warning("local agent did not stop in %.0fs; killing it", timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        return False


async def _exits(process: asyncio.subprocess.Process, timeout: float,
                 hurry: asyncio.Event) -> bool:
    """Whether ``process`` exits within ``timeout``; False as soon as ``hurry`` is set."""
    waits = {asyncio.ensure_future(process.wait()), asyncio.ensure_future(hurry.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
    return process.returncode is not None


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


async def prepare(cluster: Cluster) -> LocalAgent | None:
    """The local node's agent to start, its config written; None when none is needed.

    None when the cluster has no ``address: local`` node, or an agent already
    answers on its socket (that one, and its engines, are not ours to stop).
    The caller registers :meth:`LocalAgent.stop` before :meth:`LocalAgent.start`,
    so a stop at any moment of the start leaves nothing behind.
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
    return LocalAgent(node, socket, config, home / "agent.log", home / "agent-state")


async def launch(agent: LocalAgent) -> None:
    """Start ``agent`` and keep it alive (restarted when it dies) until its stop.

    Raises :class:`LocalAgentError` when it cannot start.
    """
    await agent.start()
    assert agent.process is not None
    log.info("local node %s: started an agent (pid %d) on %s", agent.node, agent.process.pid,
             agent.socket)
    agent.keep_alive()


def _write_config(path: Path, node: str, socket: Path, state: Path, weights: list[str]) -> None:
    settings = {
        "node": node,
        "socket": {"path": str(socket), "mode": "0600", "group": None},
        "backend": "supervise",
        "state_dir": str(state),
        "supervise": {"stop_on_exit": True, "stop_timeout": f"{ENGINE_STOP:.0f}s"},
        "readiness": {"poll_interval": "1s"},
        "declared": {"weights_dirs": weights},
    }
    yaml = YAML()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("# Written by `llmgw serve` for the local node; rewritten at each start.\n")
        yaml.dump(settings, handle)
