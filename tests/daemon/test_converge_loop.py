"""The reconcile loop in-process, against real agents on unix sockets and real test engines.

The daemon is given its agents (a pool of local transports to agents served in this
process), so no sshd is needed: what is tested is the loop and the convergence
service (:mod:`llmgw.applying.convergences`). The SSH transport has its own
end-to-end tests (tests/e2e/).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from support.engines import STUBS, alive, kill_all, running

from llmgw.agent import servers, settings
from llmgw.daemon import admin
from llmgw.daemon.reconcilers import Daemon
from llmgw.onboarding import simnodes
from llmgw.proto.conversions import UnitChange
from llmgw.spec import loading
from llmgw.transport import pools
from llmgw.transport.transports import LocalTransport

STUCK = "100000"  # seconds the stuck engine takes to list its model: never, here
READY_TIMEOUT = 600.0  # far longer than any wait below: nothing may hang on it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Node:
    name: str
    agent: servers.Agent
    server: Any
    monitor: asyncio.Task[None]


@dataclass
class Loop:
    daemon: Daemon
    directory: Path
    records: Path
    nodes: list[Node]

    def write(self, models: dict[str, Any]) -> None:
        data = {"models": with_records(models, self.records)}
        with (self.directory / "models.yaml").open("w") as out:
            YAML().dump(data, out)

    def ready(self, model: str) -> list[int]:
        """The replicas of ``model`` whose every unit is Ready."""
        fleet = self.daemon.state.fleet
        if fleet is None:
            return []
        units = [u for r in fleet.nodes.values() for u in r.units if u.model == model]
        return sorted({u.replica for u in units if u.state == "ready"})


def with_records(models: dict[str, Any], records: Path) -> dict[str, Any]:
    out = {}
    for name, model in models.items():
        env = {"TESTENGINE_RECORD_DIR": str(records), **model.get("env", {})}
        out[name] = {"source": "/models/tiny.gguf",
                     "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1,
                                   "env": env}],
                     **{k: v for k, v in model.items() if k != "env"}}
    return out


async def start_node(name: str, root: Path) -> Node:
    data = simnodes.fixture_settings("cpu-only")
    data.update({"node": name, "backend": "supervise", "state_dir": str(root / "state"),
                 "socket": {"path": str(root / "agent.sock"), "mode": "0600", "group": None},
                 "readiness": {"poll_interval": 0.1, "probe_timeout": 1.0},
                 "supervise": {"restart_backoff": 0.1, "restart_backoff_max": 0.5,
                               "stop_timeout": 2.0}})
    agent = servers.Agent(settings.Settings.model_validate(data))
    server = await servers.start(agent)
    return Node(name, agent, server, asyncio.create_task(agent.monitor.run()))


async def stop_node(node: Node) -> None:
    # A fresh look, not monitor.units: that snapshot may predate the last apply.
    names = [u.name for u in await node.agent.monitor.refresh()]
    await node.agent.apply([UnitChange(n, "", action="remove") for n in names])
    await node.server.stop(None)
    node.monitor.cancel()
    await asyncio.gather(node.monitor, return_exceptions=True)
    await node.agent.close()


@pytest.fixture
async def loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[
        Callable[[dict[str, Any]], Any]]:
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("PATH", f"{STUBS}{os.pathsep}{os.environ['PATH']}")
    root = Path(tempfile.mkdtemp(prefix="llmgw-c-", dir="/tmp"))  # a socket path is short
    stop = asyncio.Event()
    started: list[tuple[Loop, asyncio.Task[None]]] = []
    nodes: list[Node] = []

    async def make(models: dict[str, Any]) -> Loop:
        directory = tmp_path / "cluster"
        directory.mkdir()
        (root / "n1").mkdir()
        node = await start_node("n1", root / "n1")
        nodes.append(node)
        cluster_doc = {
            "cluster": {"name": "inproc", "sync": "auto", "drift_interval": "1s",
                        "auth": "none", "store": {"path": str(tmp_path / "llmgw.db")}},
            "nodes": {"n1": {"address": "127.0.0.1", "agent_socket": str(root / "n1/agent.sock"),
                             "engine_ports_from": free_port(),
                             "weights_dirs": [*simnodes.fixture_settings("cpu-only")
                                              ["declared"]["weights_dirs"],
                                              simnodes.SIM_MODELS]}},
        }
        with (directory / "cluster.yaml").open("w") as out:
            YAML().dump(cluster_doc, out)
        probe = Loop(None, directory, records, nodes)  # type: ignore[arg-type]
        probe.write(models)
        cluster = loading.load(directory)
        pool = pools.Pool(cluster, directory, transports={
            "n1": LocalTransport("n1", str(root / "n1/agent.sock"))})
        daemon = Daemon(directory, cluster, agents=pool, ready_timeout=READY_TIMEOUT)
        probe.daemon = daemon
        started.append((probe, asyncio.create_task(daemon.run(stop))))
        return probe

    yield make
    stop.set()
    for _, task in started:
        await asyncio.wait_for(task, 60)
    for node in nodes:
        await stop_node(node)
    kill_all(records)
    shutil.rmtree(root, ignore_errors=True)


def engines(loop: Loop, model: str) -> int:
    """How many engines of ``model`` run now."""
    return [name for name, _ in alive(loop.records)].count(model)


async def until(check: Callable[[], Any], what: str, loop: Loop, timeout: float = 60) -> Any:
    """Wait for ``check`` to be truthy (bounded); fail with what the daemon knows."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            state = loop.daemon.state
            reports = state.fleet.nodes.values() if state.fleet else []
            raise AssertionError(
                f"timed out waiting for {what}; waiting {admin.waiting(loop.daemon)}; "
                f"plan {state.plan.summary() if state.plan else None}; units "
                f"{[(u.name, u.state) for r in reports for u in r.units]}")
        await asyncio.sleep(0.1)


async def test_a_model_that_never_loads_holds_up_neither_repairs_nor_edits(loop: Any) -> None:
    """One replica that never answers /v1/models: the loop goes on without it.

    A model stopped by hand meanwhile is restarted, a fix to the stuck model is
    applied at once (its wait, moot, is cancelled), and the status says what is
    waited for, and for how long, meanwhile.
    """
    models = {"tiny": {}, "stuck": {"env": {"TESTENGINE_LOAD_DELAY": STUCK}}}
    served: Loop = await loop(models)
    await until(lambda: served.ready("tiny"), "tiny ready", served)
    waits = await until(lambda: [w for w in admin.waiting(served.daemon)
                                 if w["model"] == "stuck" and w["state"] == "loading"],
                        "the wait for stuck, loading", served)
    assert waits[0]["line"].startswith("stuck r0: loading ") and " of 10m" in waits[0]["line"]
    assert waits[0]["timeout"] == READY_TIMEOUT

    # Stopped by hand while stuck loads: repaired at the next drift tick, not after it.
    engine = running(served.records)["tiny"]
    os.killpg(engine["pgid"], signal.SIGTERM)
    await until(lambda: running(served.records).get("tiny", {}).get("pid")
                not in (None, engine["pid"]) and served.ready("tiny"), "tiny restarted", served)
    assert "stuck" in {w["model"] for w in admin.waiting(served.daemon)}  # still waited for

    # A fix pushed meanwhile: the wait it made moot ends and the fix is applied.
    served.write({"tiny": {}, "stuck": {}})
    await until(lambda: served.ready("stuck") and not admin.waiting(served.daemon),
                "the fixed stuck model ready", served)
    # The stuck replica goes once its replacement serves (that change's own second call).
    await until(lambda: engines(served, "stuck") == 1, "one stuck engine left", served)
    assert served.ready("stuck") == [1]


async def test_a_replace_in_flight_is_not_planned_again(loop: Any) -> None:
    """While a create-before-destroy replace loads, the loop plans again and again; it
    neither scales the loading replica down nor starts a third one."""
    served: Loop = await loop({"tiny": {}})
    await until(lambda: served.ready("tiny") == [0], "tiny r0 ready", served)
    first = running(served.records)["tiny"]["pid"]
    iterations = served.daemon.state.iterations

    served.write({"tiny": {"env": {"TESTENGINE_LOAD_DELAY": "4"}}})
    await until(lambda: [w for w in admin.waiting(served.daemon) if w["replica"] == 1],
                "the wait for tiny r1", served)
    await until(lambda: served.daemon.state.iterations >= iterations + 4,
                "iterations while r1 loads", served)
    await until(lambda: served.ready("tiny") == [1] and not admin.waiting(served.daemon),
                "r1 ready and r0 gone", served)
    await until(lambda: engines(served, "tiny") == 1, "r0's engine gone", served)
    assert first not in [data["pid"] for name, data in alive(served.records) if name == "tiny"]
    started = {p.name for p in served.records.glob("*.json")}
    assert len(started) == 2, f"one engine per replica, no third: {sorted(started)}"
