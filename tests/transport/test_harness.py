"""The simulated-node harness itself: it must leave nothing running behind."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

from support import nodes

from llmgw.proto.conversions import UnitChange
from llmgw.rendering import units
from llmgw.spec import loading
from llmgw.transport import pools

ENGINE = Path(__file__).resolve().parents[1] / "support" / "testengine.py"


def engine_unit(port: int) -> UnitChange:
    spec = units.UnitSpec(
        name="llmgw-m-r0-s0.service", model="m", replica=0, rank=0, ranks=1, node="node-01",
        engine="vllm", digest="d", spec_json="{}", port=port,
        argv=(sys.executable, str(ENGINE), "serve", "m", "--port", str(port), "--fork-worker"),
    )
    files = units.render(spec, stop_timeout="5")
    return UnitChange(files.name, files.unit_text)


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_close_stops_sshd_agents_sessions_and_engines() -> None:
    sim = nodes.SimCluster.create()
    try:
        for index in (1, 2):
            sim.add_node(f"node-0{index}")
        sim.start()
        sim.pin_host_keys()
        cluster = loading.load(sim.write_cluster())
        port = nodes.free_port()

        async def start_engine() -> None:
            async with pools.Pool(cluster, sim.cluster_dir) as pool:
                await pool.call("node-01", lambda agent: agent.apply_units([engine_unit(port)]))
                for _ in range(300):  # until the engine (and its forked worker) run
                    report = await pool.report("node-01")
                    if [u.state for u in report.units] == ["ready"]:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"engine never ready: {report.units}")

        asyncio.run(start_engine())
        started = sim._strays() + [p for n in sim.nodes.values() for p in n.processes()]
        # sshd ×2, agent ×2, the engine and its worker; sessions were closed with the pool.
        assert len(set(started)) >= 6
    finally:
        sim.close()
    assert sim._strays() == []
    assert not any(nodes._alive(pid) for pid in started)
    assert all(refuses(n.port) for n in sim.nodes.values())
    assert not sim.root.exists()


def test_clusters_of_a_killed_run_are_swept() -> None:
    script = (
        "import sys, time; sys.path.insert(0, 'tests'); from support import nodes\n"
        "sim = nodes.SimCluster.create(); sim.add_node('node-01'); sim.start()\n"
        "print(sim.root, flush=True); time.sleep(600)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).resolve().parents[2]) as run:
        assert run.stdout is not None
        root = Path(run.stdout.readline().strip())
        run.kill()  # as a CI timeout would: no cleanup runs
    abandoned = nodes.SimCluster(root)
    left = abandoned._strays()
    assert len(left) >= 2  # sshd and the agent outlived their test run
    assert root in nodes.sweep_abandoned()
    assert not any(nodes._alive(pid) for pid in left)
    assert not root.exists()
