"""``llmgw serve`` end to end: the reconcile loop over real sshd nodes and agents.

Each test starts the daemon as a real process on a simulated cluster with
``sync: auto`` and a short drift timer, and watches it through its admin API.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from support import daemons, nodes
from support.engines import MODELS, alive, recording, running
from support.plugin import SimClusterFactory

from llmgw.fleet.types import Fleet
from llmgw.rendering import units
from llmgw.transport.agent_client import AgentClient, UnitChange

Check = Callable[[dict[str, Any]], bool]


class Served(daemons.Daemon):
    """A running ``llmgw serve`` and its admin API, its store beside the cluster directory."""

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        process = super().start("--ready-timeout", "60s", "--log-level", "debug", *args)
        self.wait(lambda s: s["observed_at"] is not None, "the first observation")
        return process


def ticks(status: dict[str, Any], count: int) -> Check:
    """True once the daemon has run ``count`` more iterations than in ``status``."""
    return lambda now: bool(now["iterations"] >= status["iterations"] + count)


def after(moment: float) -> Check:
    """True once the monotonic clock has passed ``moment`` (a status read then)."""
    return lambda _status: time.monotonic() > moment


def ready(models: set[str]) -> Check:
    def check(status: dict[str, Any]) -> bool:
        up = {r["model"] for r in status["replicas"] if r["state"] == "ready"}
        return up == models and not (status["plan"] or {}).get("has_changes", True)
    return check


@pytest.fixture
def serve(
    sim_cluster: SimClusterFactory, engines: Path, tmp_path: Path
) -> Iterator[Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]]]:
    started: list[Served] = []

    def make(models: dict[str, Any]) -> tuple[Served, nodes.SimCluster]:
        sim = sim_cluster(2, hardware=("h100-ib", "cpu-only"))
        served = Served(sim.cluster_dir, tmp_path / "serve.log")
        write(sim, served, models)
        served.start()
        started.append(served)
        return served, sim

    yield make
    for served in started:
        served.stop()


def write(sim: nodes.SimCluster, served: Served, models: dict[str, Any]) -> Path:
    directory = sim.write_cluster({"models": recording(models)})
    data = (directory / "cluster.yaml").read_text()
    extra = ("  sync: auto\n  drift_interval: 1s\n  auth: none\n"
             f"  store: {{path: {directory.parent / 'llmgw.db'}}}\n  listeners:\n"
             + "".join(f"    {k}: {v}\n" for k, v in served.listeners().items()))
    (directory / "cluster.yaml").write_text(data.replace("cluster:\n", "cluster:\n" + extra, 1))
    return directory


def test_the_daemon_converges_follows_edits_and_refuses_invalid_ones(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path
) -> None:
    served, sim = serve(MODELS)
    status = served.wait(ready({"chat", "tiny"}), "both models ready")
    assert status["last_apply"]["ok"] is True

    # The router routes to what the daemon found ready.
    reply = httpx.post(f"{served.router}/v1/completions",
                       json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=10)
    assert reply.status_code == 200, reply.text

    # An edit is followed: changed args replace the replica.
    changed = json.loads(json.dumps(MODELS))
    changed["chat"]["profiles"][0]["args"]["max-model-len"] = 4096
    write(sim, served, changed)
    served.wait(lambda s: any(
        "--max-model-len" in d["argv"] and d["argv"][d["argv"].index("--max-model-len") + 1]
        == "4096" for d in [running(engines).get("chat", {"argv": []})]
    ) and ready({"chat", "tiny"})(s), "the replaced replica")

    # An invalid edit is refused with its errors; the fleet keeps running.
    pids = {name: data["pid"] for name, data in running(engines).items()}
    (served.directory / "broken.yaml").write_text("models:\n  chat:\n    profiles: oops\n")
    status = served.wait(lambda s: bool(s["refused_edit"]), "the refused edit")
    assert any("broken.yaml" in line and "duplicate model 'chat'" in line
               for line in status["refused_edit"]), status["refused_edit"]
    served.wait(ticks(status, 2), "two drift ticks")
    assert {name: data["pid"] for name, data in running(engines).items()} == pids

    # Fixing it clears the refusal; removing a model stops its engine.
    (served.directory / "broken.yaml").unlink()
    del changed["chat"]
    write(sim, served, changed)
    served.wait(lambda s: not s["refused_edit"] and ready({"tiny"})(s), "chat removed")
    assert set(running(engines)) == {"tiny"}

    # The snapshot CI plans against, and the plan, from the admin API.
    fleet = Fleet.model_validate_json(httpx.get(f"{served.admin}/api/v1/fleet",
                                                       headers=served.auth()).text)
    assert set(fleet.nodes) == {"node-01", "node-02"}
    markdown = httpx.get(f"{served.admin}/api/v1/plan", params={"format": "markdown"},
                         headers=served.auth()).text
    assert "No changes" in markdown or "0 to create" in markdown


def test_drift_is_repaired_stopped_units_return_and_strangers_are_removed(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path
) -> None:
    models = {"tiny": MODELS["tiny"]}
    served, sim = serve(models)
    served.wait(ready({"tiny"}), "tiny ready")
    engine = running(engines)["tiny"]

    # Stopped by hand (a clean SIGTERM: no restart-on-failure): it comes back.
    os.killpg(engine["pgid"], signal.SIGTERM)
    served.wait(lambda s: running(engines).get("tiny", {}).get("pid") not in (None, engine["pid"])
                and ready({"tiny"})(s), "tiny back with a new engine")

    # A unit with llmgw labels that no plan wants is removed.
    node = next(n for n in sim.nodes.values() if n.hardware == "cpu-only")
    stranger = stranger_unit(engines)
    asyncio.run(apply_directly(node, stranger))
    # It may be gone before any status shows it: the daemon's log says what it did.
    served.wait(lambda s: "ghost r0 will be destroyed" in served.log.read_text(),
                "the stranger's removal to be planned")
    served.wait(lambda s: "ghost" not in asyncio.run(units_on(node)), "the stranger removed")
    assert set(running(engines)) == {"tiny"}


def test_a_restarted_daemon_adopts_the_fleet_and_restarts_nothing(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path
) -> None:
    served, _ = serve(MODELS)
    served.wait(ready({"chat", "tiny"}), "both ready")
    before = {name: data["pid"] for name, data in running(engines).items()}

    served.stop()
    assert {name: data["pid"] for name, data in running(engines).items()} == before
    served.start()
    status = served.wait(ready({"chat", "tiny"}), "adopted")

    assert status["last_apply"] is None  # nothing to apply: the fleet is the state
    assert {name: data["pid"] for name, data in running(engines).items()} == before


def test_the_applied_git_revision_is_recorded(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path,
) -> None:
    served, sim = serve({"tiny": MODELS["tiny"]})
    served.wait(ready({"tiny"}), "tiny ready")
    git = ["git", "-C", str(served.directory), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fleet"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (served.directory / "note.yaml").write_text("# a comment-only file\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "note"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    status = served.wait(lambda s: s["applied_revision"] == head, "the applied revision")
    assert status["revision"] == head


def stranger_unit(records: Path) -> UnitChange:
    """A well-formed llmgw unit that no plan asked for."""
    files = units.render(units.UnitSpec(
        name="llmgw-ghost-r0-s0.service", model="ghost", replica=0, rank=0, ranks=1,
        node="stranger", engine="llama.cpp", digest="0000000000000000", spec_json="{}",
        argv=("/usr/bin/env", "llama-server", "--alias", "ghost", "--port", "29999"),
        env=(("TESTENGINE_RECORD_DIR", str(records)),),
    ))
    return UnitChange(files.name, files.unit_text, "", {}, "start")


async def units_on(node: nodes.SimNode) -> str:
    async with grpc.aio.insecure_channel(f"unix:{node.agent_socket}") as channel:
        report = await AgentClient(channel, timeout=10).report()
    return " ".join(unit.name for unit in report.units)


async def apply_directly(node: nodes.SimNode, unit: UnitChange) -> None:
    async with grpc.aio.insecure_channel(f"unix:{node.agent_socket}") as channel:
        results = await AgentClient(channel, timeout=10).apply_units([unit])
    assert results[0].ok, results[0].error


def test_an_on_demand_model_loads_on_the_first_request_and_stops_when_idle(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path,
) -> None:
    coder = {"source": "/models/coder.gguf",
             "scaling": {"min": 0, "max": 1, "idle_timeout": "4s"},
             "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1}]}
    served, _ = serve({"coder": coder})
    served.wait(lambda s: s["plan"] is not None, "the first plan")
    assert "coder" not in running(engines)  # min 0: nothing runs before it is asked for

    # The first request waits while the daemon places and loads it, then is answered.
    reply = httpx.post(f"{served.router}/v1/completions",
                       json={"model": "coder", "prompt": "def f():", "max_tokens": 4},
                       timeout=30)
    assert reply.status_code == 200, reply.text
    assert "coder" in running(engines)

    # Unused for longer than idle_timeout: the daemon stops it.
    served.wait(lambda s: not s["replicas"], "the idle replica to stop", timeout=30)
    assert "coder" not in running(engines)
    status = served.status()
    assert status["last_apply"]["ok"] is True

    # An unknown model is "not found", never "loading".
    reply = httpx.post(f"{served.router}/v1/completions",
                       json={"model": "nope", "prompt": "x"}, timeout=30)
    assert reply.status_code == 404
    assert "model not found" in reply.text


def test_a_restarted_daemon_does_not_stop_a_busy_on_demand_replica(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path,
) -> None:
    coder = {"source": "/models/coder.gguf",
             "scaling": {"min": 0, "max": 1, "idle_timeout": "6s"},
             "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1}]}
    served, _ = serve({"coder": coder})
    served.wait(lambda s: s["plan"] is not None, "the first plan")
    flowing, done = threading.Event(), threading.Event()
    answered: list[int] = []

    def traffic() -> None:
        while not done.is_set():
            if flowing.wait(0.1):
                try:
                    answered.append(httpx.post(
                        f"{served.router}/v1/completions", timeout=30,
                        json={"model": "coder", "prompt": "x", "max_tokens": 2}).status_code)
                except httpx.HTTPError:
                    pass  # the daemon is restarting
                time.sleep(0.5)

    thread = threading.Thread(target=traffic, daemon=True)
    flowing.set()
    thread.start()
    try:
        served.wait(ready({"coder"}), "coder loaded on demand")
        engine = running(engines)["coder"]["pid"]
        # Busy all along, and now older than its idle_timeout, with a plan made since.
        served.wait(ticks(served.wait(after(time.monotonic() + 6), "idle_timeout"), 1),
                    "a plan past idle_timeout")
        assert 200 in answered
        # The restart leaves a gap shorter than idle_timeout, but the new router has seen
        # no request when the new daemon makes its first plan.
        flowing.clear()
        served.stop()
        served.start()
        flowing.set()
        # Past idle_timeout since the restart, under traffic, and planned since.
        served.wait(ticks(served.wait(after(time.monotonic() + 6), "idle_timeout"), 1),
                    "a plan past idle_timeout since the restart")
        assert running(engines).get("coder", {}).get("pid") == engine
        assert "coder r0 will be destroyed" not in served.log.read_text()
    finally:
        done.set()
        thread.join(60)
    # Traffic over: now it is idle, and it stops.
    served.wait(lambda s: not s["replicas"], "the idle replica to stop", timeout=60)
    assert "coder" not in running(engines)


def test_a_replica_on_a_node_that_stops_answering_is_not_placed_twice(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path,
) -> None:
    served, sim = serve({"tiny": MODELS["tiny"]})
    status = served.wait(ready({"tiny"}), "tiny ready")
    where = next(r["node"] for r in status["replicas"] if r["model"] == "tiny")
    node = sim.nodes[where]
    node.rotate_host_key()  # now the daemon refuses it: unreachable, its engine still runs
    node.restart_sshd()

    status = served.wait(lambda s: not s["nodes"][where]["reachable"], "the node refused")
    # Three drift ticks in which a careless planner would place it again.
    status = served.wait(ticks(status, 3), "three drift ticks")
    assert "host key" in status["nodes"][where]["error"]
    assert [name for name, _ in alive(engines)] == ["tiny"]  # one engine, not two
    assert status["last_apply"]["summary"].startswith("Apply: 1 of 1")  # only the first create


def test_the_daemons_applies_are_journaled_and_served_to_admins_only(
    serve: Callable[[dict[str, Any]], tuple[Served, nodes.SimCluster]], engines: Path,
) -> None:
    served, sim = serve({"tiny": MODELS["tiny"]})
    served.wait(ready({"tiny"}), "tiny ready")
    url = f"{served.admin}/api/v1/history"
    assert httpx.get(url, timeout=5).status_code == 401
    reply = httpx.get(url, headers=served.auth(), timeout=5)
    assert reply.status_code == 200, reply.text
    (entry,) = reply.json()
    assert entry["started_by"] == "daemon" and entry["outcome"] == "ok"
    assert [(c["action"], c["model"], c["outcome"]) for c in entry["changes"]] == [
        ("create", "tiny", "ok")]
    assert entry["changes"][0]["nodes"] == ["node-02"]
    assert httpx.get(url, params={"model": "chat"}, headers=served.auth(),
                     timeout=5).json() == []
    for bad in ({"limit": "0"}, {"limit": "x"}, {"model": "../etc"}):
        assert httpx.get(url, params=bad, headers=served.auth(), timeout=5).status_code == 400
