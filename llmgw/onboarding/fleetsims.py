"""The fleet simulator: thousands of nodes in one process, each a real agent.

Every simulated node is the real agent (:class:`llmgw.agent.servers.Agent`,
its gRPC :class:`~llmgw.agent.servers.Service`) with fixture hardware from
``onboarding/hardware/`` (h100-ib, l40s-nofabric and cpu-only in turn), served
by its own ``grpc.aio`` server on its own unix socket, ``<sockets>/<node>.sock``.
The daemon reaches them through :class:`llmgw.transport.transports.SimulatedTransport`
(``llmgw serve --simulated DIR``), which stands in for SSH only: the SSH path has
its own tests and bench (``tests/e2e/``, ``tests/bench/fanout.py``).

Three things are stood in for, so that a thousand nodes fit on one machine:

* the engines: :class:`StandInEngines` is a unit backend that validates each
  unit as the real ones do (:func:`llmgw.agent.units.check`), "runs" it at once
  and reports it loading until ``load_delay`` has passed, then ready (its
  :meth:`StandInEngines.probe` answers the monitor's readiness questions);
* the fixture commands (the recorded ``nvidia-smi``): run once per hardware
  kind and their output shared (:class:`SharedRunner`), not once per report;
* the engines' metrics: none are scraped.

With ``relay``, the process also serves a relay (:mod:`llmgw.transport.relays`) for
its nodes on ``<sockets>/relay-<i>.sock``, advertised in ``<sockets>/relays-<i>.json``:
the daemon then holds one channel and one merged push stream per process instead of
one of each per node, and the relay holds the per-node ones, in this process, as a
relay near its nodes would.

Nodes can be lost and brought back (:meth:`SimulatedFleet.lose`,
:meth:`SimulatedFleet.restore`): the node's gRPC server stops (its socket goes)
and starts again with the same agent and units, as a partitioned node comes back.

Usage::

    async with SimulatedFleet(Path("/tmp/fs"), 1000, load_delay=2.0) as sim:
        directory = sim.write_cluster(models)       # cluster.yaml + models.yaml
        pool = pools.Pool(loading.load(directory), directory,
                          simulated=sim.sockets, push=True)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import shutil
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from ruamel.yaml import YAML

from llmgw.agent import commands, listeners, readiness, servers, settings, unitfiles, units
from llmgw.agent.unitlogs import Query
from llmgw.agent.units import Observation, UnitChange, UnitResult
from llmgw.fleet.types import EngineLimits, Unit
from llmgw.onboarding import simnodes
from llmgw.proto import agent_pb2_grpc
from llmgw.transport import relays
from llmgw.transport.transports import SimulatedTransport

log = logging.getLogger(__name__)

KINDS = ("h100-ib", "l40s-nofabric", "cpu-only")
DEFAULT_LOAD_DELAY = 2.0
ENGINE_PORTS_FROM = 20000  # nothing binds them: the stand-in engines answer from memory
POLL_INTERVAL = 30.0  # each agent's own look at its units; changes poke it sooner
FACTS_INTERVAL = 600.0
NODES_PER_FILE = 2000  # the fixture hardware never changes: read it seldom


@dataclass
class _Running:
    labels: unitfiles.Labels
    text: str
    started: float
    ready_at: float
    stopped: bool = False


class StandInEngines:
    """A unit backend whose engines are stand-ins: loading for ``load_delay``, then ready.

    Units are checked as the real backends check them (a unit llmgw would refuse is
    refused here too), and reported by the real monitor; only the process and the
    engine's answers are simulated.
    """

    kind = "standin"

    def __init__(self, load_delay: float, changed: Callable[[], None] = lambda: None) -> None:
        self.load_delay = load_delay
        self.changed = changed  # the monitor's poke: a stand-in became ready
        self._units: dict[str, _Running] = {}
        self._timers: list[asyncio.TimerHandle] = []

    async def apply(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        results = []
        now = time.time()
        for change in changes:
            if change.action == "remove":
                results.append(UnitResult(change.name, ok=True,
                                          changed=self._units.pop(change.name, None) is not None))
                continue
            try:
                _, labels = units.check(change)
            except unitfiles.UnitFileError as exc:
                results.append(UnitResult(change.name, ok=False, error=str(exc)))
                continue
            before = self._units.get(change.name)
            if change.action == "stop":
                if before is not None:
                    before.stopped = True
                results.append(UnitResult(change.name, ok=True, changed=before is not None))
                continue
            if before is not None and before.text == change.unit_text and not before.stopped:
                results.append(UnitResult(change.name, ok=True, changed=False))
                continue
            self._units[change.name] = _Running(labels, change.unit_text, now,
                                                now + self.load_delay)
            self._timers.append(asyncio.get_running_loop().call_later(
                self.load_delay, self.changed))
            results.append(UnitResult(change.name, ok=True, changed=True))
        self._timers = [t for t in self._timers if not t.cancelled()][-64:]
        return results

    async def observe(self) -> list[Observation]:
        return [Observation(name, unit.labels, "stopped" if unit.stopped else "running",
                            pid=100000 + index, since=unit.started)
                for index, (name, unit) in enumerate(sorted(self._units.items()))]

    async def probe(self, obs: Observation) -> tuple[readiness.Probe | None,
                                                     listeners.Finding | None]:
        """The readiness questions (:func:`llmgw.agent.readiness.state`), answered by the
        stand-in: up at once, its model listed once ``load_delay`` has passed."""
        unit = self._units.get(obs.name)
        if unit is None or unit.stopped or obs.labels is None:
            return None, None
        if time.time() < unit.ready_at:
            return readiness.Probe(True, error="stand-in engine loading"), None
        served = obs.labels.raw.get("X-Llmgw-Served-Name") or obs.labels.model
        return readiness.Probe(True, (served,)), None

    async def logs(self, name: str, query: Query) -> list[str]:
        if name not in self._units:
            raise KeyError(name)
        return ["stand-in engine (llmgw lab simulate)"][-query.lines:]

    async def follow(self, name: str, query: Query) -> AsyncGenerator[str, None]:
        for line in await self.logs(name, query):
            yield line
        await asyncio.Event().wait()  # no new lines, until the caller leaves

    def owns(self, pid: int) -> bool:
        return False

    def unit_of(self, pid: int) -> str | None:
        return None

    async def engine_limits(self) -> EngineLimits | None:
        return None

    async def tick(self) -> None:
        return None

    async def close(self) -> None:
        for timer in self._timers:
            timer.cancel()


class SharedRunner:
    """Runs each fixture command once and hands its output to every node that asks."""

    def __init__(self, timeout: float = commands.DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._done: dict[tuple[str, ...], asyncio.Future[commands.Completed]] = {}

    async def __call__(self, argv: Sequence[str]) -> commands.Completed:
        key = tuple(argv)
        found = self._done.get(key)
        if found is None:
            found = self._done[key] = asyncio.ensure_future(commands.run(argv, self.timeout))
        return await asyncio.shield(found)


class _NoLoads:
    """Stand-in engines have no metrics endpoint: no load is read."""

    async def loads(self, units: Sequence[Unit]) -> list[Unit]:
        return list(units)

    async def close(self) -> None:
        return None


@dataclass
class SimulatedNode:
    name: str
    kind: str
    agent: servers.Agent
    server: grpc.aio.Server | None = None
    monitor: asyncio.Task[None] | None = None


@dataclass
class SimulatedFleet:
    """``count`` simulated nodes under ``root``; an async context manager."""

    root: Path
    count: int
    load_delay: float = DEFAULT_LOAD_DELAY
    kinds: Sequence[str] = KINDS
    prefix: str = "sim"
    # (i, n): this process serves every n-th node from the i-th, so n processes share a
    # fleet (each node holds two descriptors: its listener and the daemon's connection).
    part: tuple[int, int] = (0, 1)
    relay: bool = False  # also serve a relay for this part's nodes (see the module's doc)
    nodes: dict[str, SimulatedNode] = field(default_factory=dict)
    _relay: tuple[grpc.aio.Server, relays.RelayServer] | None = None
    _runner: SharedRunner = field(default_factory=SharedRunner)

    @property
    def sockets(self) -> Path:
        return self.root / "sockets"

    @property
    def cluster_dir(self) -> Path:
        return self.root / "cluster"

    def names(self) -> list[str]:
        width = max(4, len(str(self.count)))
        return [f"{self.prefix}-{i:0{width}d}" for i in range(1, self.count + 1)]

    async def __aenter__(self) -> SimulatedFleet:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Make every node's agent and start serving them all."""
        self.sockets.mkdir(parents=True, exist_ok=True)
        mine, parts = self.part
        for index, name in enumerate(self.names()):
            if index % parts == mine:
                kind = self.kind(index)
                self.nodes[name] = SimulatedNode(name, kind, self._agent(name, kind))
        await self.restore(self.nodes)
        for node in self.nodes.values():
            node.monitor = asyncio.create_task(node.agent.monitor.run(),
                                               name=f"monitor-{node.name}")
        if self.relay:
            await self._serve_relay()

    @property
    def relay_socket(self) -> Path:
        return self.sockets / f"relay-{self.part[0]}.sock"

    async def _serve_relay(self) -> None:
        relay = relays.RelayServer({
            name: SimulatedTransport(name, str(self.sockets / f"{name}.sock"))
            for name in self.nodes})
        server = grpc.aio.server(options=relays.SERVER_OPTIONS)
        relay.add_to(server)
        server.add_insecure_port(f"unix:{self.relay_socket}")
        await server.start()
        self._relay = server, relay
        relays.advertise(self.sockets, self.part[0], self.relay_socket, list(self.nodes))

    def kind(self, index: int) -> str:
        return self.kinds[index % len(self.kinds)]

    def _agent(self, name: str, kind: str) -> servers.Agent:
        data = copy.deepcopy(_fixture(kind))
        home = self.root / "nodes" / name
        data.update({
            "node": name, "backend": "supervise", "state_dir": str(home / "state"),
            "socket": {"path": str(self.sockets / f"{name}.sock"), "mode": "0600",
                       "group": None},
            "engines": {"dir": str(home / "engines")},
            "readiness": {"poll_interval": POLL_INTERVAL, "probe_timeout": 1.0},
        })
        engines = StandInEngines(self.load_delay)
        agent = servers.Agent(settings.Settings.model_validate(data), engines,
                              run=self._runner, prober=engines.probe, scraper=_NoLoads(),
                              facts_interval=FACTS_INTERVAL)
        engines.changed = agent.monitor.poke
        return agent

    async def lose(self, names: Iterable[str]) -> None:
        """Stop these nodes' servers at once (the socket goes; the agents keep their units)."""
        nodes = [self.nodes[n] for n in names if n in self.nodes
                 and self.nodes[n].server is not None]
        for node in nodes:
            node.agent.monitor.end_watches()  # open streams end now, as a lost link ends them
        await asyncio.gather(*(n.server.stop(None) for n in nodes if n.server is not None))
        for node in nodes:
            node.server = None
            (self.sockets / f"{node.name}.sock").unlink(missing_ok=True)

    async def restore(self, names: Iterable[str]) -> None:
        """Serve these nodes again (each on its own socket), with the units they had."""
        for name in names:
            node = self.nodes.get(name)
            if node is None or node.server is not None:
                continue  # another part's, or serving
            server = grpc.aio.server()
            agent_pb2_grpc.add_AgentServicer_to_server(servers.Service(node.agent), server)
            server.add_insecure_port(f"unix:{self.sockets / f'{name}.sock'}")
            await server.start()
            node.server = server

    async def aclose(self) -> None:
        if self._relay is not None:
            server, relay = self._relay
            self._relay = None
            await server.stop(None)
            await relay.aclose()
            (self.sockets / f"relays-{self.part[0]}.json").unlink(missing_ok=True)
        await self.lose(list(self.nodes))
        for node in self.nodes.values():
            if node.monitor is not None:
                node.monitor.cancel()
        await asyncio.gather(*(n.monitor for n in self.nodes.values() if n.monitor),
                             return_exceptions=True)
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                await node.agent.close()
        shutil.rmtree(self.root / "nodes", ignore_errors=True)

    def cluster_data(self, **settings_: Any) -> dict[str, Any]:
        """``cluster.yaml`` for these nodes: each one's fabrics and weights directories as
        its fixture declares them (plus /models, where the tests' path sources live)."""
        nodes: dict[str, Any] = {}
        fabrics: dict[str, Any] = {}
        for index, name in enumerate(self.names(), start=1):  # every part's nodes
            declared = _fixture(self.kind(index - 1))["declared"]
            # An address of its own on loopback (127.0.0.0/8): the cluster refuses two
            # nodes at one address, and the routes name it; the SSH port is never used.
            address = f"127.{1 + (index >> 16)}.{(index >> 8) & 255}.{index & 255}"
            spec: dict[str, Any] = {"address": address, "engine_ports_from": ENGINE_PORTS_FROM,
                                    "weights_dirs": [*declared.get("weights_dirs", []),
                                                     simnodes.SIM_MODELS]}
            for fabric, entry in (declared.get("fabrics") or {}).items():
                spec.setdefault("fabrics", {})[fabric] = list(entry.get("adapters", []))
                fabrics.setdefault(fabric, {"kind": entry["kind"]})
            nodes[name] = spec
        data: dict[str, Any] = {
            "cluster": {"name": "simulated", "sync": "auto", "auth": "none",
                        **settings_},
            "nodes": nodes,
        }
        if fabrics:
            data["fabrics"] = fabrics
        return data

    def write_cluster(self, models: Mapping[str, Any], **settings_: Any) -> Path:
        """Write ``cluster.yaml``, the nodes (``nodes-NN.yaml``, :data:`NODES_PER_FILE`
        each: the loader reads at most 1 MiB of a file) and ``models.yaml``."""
        self.cluster_dir.mkdir(parents=True, exist_ok=True)
        data = self.cluster_data(**settings_)
        nodes = list(data.pop("nodes").items())
        _dump(self.cluster_dir / "cluster.yaml", data)
        for number, start in enumerate(range(0, len(nodes), NODES_PER_FILE), start=1):
            _dump(self.cluster_dir / f"nodes-{number:02d}.yaml",
                  {"nodes": dict(nodes[start:start + NODES_PER_FILE])})
        write_models(self.cluster_dir, models)
        return self.cluster_dir


@functools.cache
def _fixture(kind: str) -> dict[str, Any]:
    """The fixture's agent settings, read once per kind (a copy is taken for each node)."""
    return simnodes.fixture_settings(kind)


def models(count: int, replicas: int = 1, *, prefix: str = "m",
           edited: Iterable[str] = ()) -> dict[str, Any]:
    """``count`` small CPU models (llama.cpp, 1 GB each) of ``replicas`` each; the names in
    ``edited`` get another context size (a spec change: each replica replaced)."""
    changed = set(edited)
    found = {}
    for i in range(count):
        name = f"{prefix}{i:05d}"
        args = {"ctx-size": 4096 if name in changed else 2048}
        found[name] = {"source": f"{simnodes.SIM_MODELS}/tiny.gguf",
                       "scaling": {"min": replicas, "max": replicas},
                       "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1,
                                     "args": args}]}
    return found


def write_models(directory: Path, data: Mapping[str, Any]) -> None:
    _dump(directory / "models.yaml", {"models": dict(data)})


def _dump(path: Path, data: Mapping[str, Any]) -> None:
    yaml = YAML()
    yaml.default_flow_style = False
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as out:
        yaml.dump(dict(data), out)
    tmp.replace(path)
