"""The agent's gRPC API over a real unix socket, with real engines behind it."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import shutil
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_support import (
    NODES,
    eventually,
    free_port,
    node_settings,
    short_dir,
    unit_name,
    unit_text,
)

from llmgw.agent import servers
from llmgw.agent.settings import Settings
from llmgw.discovery.fabrics import Declaration, DeclaredFabric
from llmgw.fleet.types import Unit
from llmgw.proto import agent_pb2 as pb
from llmgw.proto import agent_pb2_grpc
from llmgw.proto.conversions import UnitChange
from llmgw.transport.agent_client import AgentClient


@dataclass
class Served:
    agent: servers.Agent
    client: AgentClient
    channel: Any
    root: Path

    @property
    def socket(self) -> Path:
        return Path(self.agent.settings.socket.path)


@pytest.fixture
def root() -> Any:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def serving(settings: Settings, root: Path) -> AsyncIterator[Served]:
    agent = servers.Agent(settings)
    server = await servers.start(agent)
    monitor = asyncio.create_task(agent.monitor.run())
    channel = grpc.aio.insecure_channel(f"unix:{settings.socket.path}")
    served = Served(agent, AgentClient(channel, timeout=20), channel, root)
    try:
        yield served
    finally:
        # A fresh look, not monitor.units: that snapshot may predate the last apply.
        names = [u.name for u in await agent.monitor.refresh()]
        await agent.apply([UnitChange(n, "", action="remove") for n in names])
        await channel.close()
        await server.stop(None)
        monitor.cancel()
        await asyncio.gather(monitor, return_exceptions=True)
        await agent.close()


@pytest.fixture
async def h100(root: Path) -> AsyncIterator[Served]:
    async with serving(node_settings("h100-ib", root), root) as served:
        yield served


async def test_report_over_the_socket_checks_what_the_daemon_declares(h100: Served) -> None:
    declared = Declaration(
        "gpu-a-01",
        (DeclaredFabric("ib-a", "infiniband", ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")),
         DeclaredFabric("ib-b", "infiniband", ("mlx5_4",))),
        (str(NODES / "h100-ib" / "models"),),
    )
    report = await h100.client.report(declared)
    assert report.node == "gpu-a-01"
    assert [g.gpu_class for g in report.gpus] == ["h100-80g"] * 8
    assert report.memory_total_bytes == 2113484856 * 1024 and report.cpu_count == 224
    fabrics = {f.name: f for f in report.fabrics}
    assert fabrics["ib-a"].advertised and fabrics["ib-a"].adapters == [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"
    ]
    assert not fabrics["ib-b"].advertised
    assert "adapter mlx5_4 is declared but not present" in fabrics["ib-b"].reasons[0]
    assert [w.format for w in report.weights] == ["safetensors"]
    # Without a declaration, the agent checks against its own settings.
    assert (await h100.client.report()).node == "h100-ib"


async def test_socket_is_private_to_its_group(root: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    settings = node_settings("cpu-only", root, socket={"group": group})
    async with serving(settings, root) as served:
        info = served.socket.stat()
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o660 and info.st_gid == os.getgid()


async def test_a_missing_group_is_a_clear_error(root: Path) -> None:
    settings = node_settings("cpu-only", root, socket={"group": "no-such-group-llmgw"})
    with pytest.raises(servers.ServeError, match="groupadd --system no-such-group-llmgw"):
        await servers.start(servers.Agent(settings))
    assert not (root / "agent.sock").exists()


async def test_stale_socket_is_replaced_and_a_live_one_refused(h100: Served, root: Path) -> None:
    with pytest.raises(servers.ServeError, match="already serving"):
        await servers.start(servers.Agent(h100.agent.settings))
    other = short_dir()
    try:
        stale = other / "agent.sock"
        subprocess.run(  # a socket file nobody listens on, as a killed agent leaves it
            ["python3", "-c", f"import socket; socket.socket(socket.AF_UNIX).bind('{stale}')"],
            check=True,
        )
        settings = node_settings("cpu-only", other)
        async with serving(settings, other) as served:
            assert (await served.client.report()).node == "cpu-only"
    finally:
        shutil.rmtree(other, ignore_errors=True)


async def test_readiness_starting_then_loading_then_ready(h100: Served) -> None:
    seen: list[str] = []

    async def watch() -> None:
        async for unit in h100.client.watch_units():
            if unit.name == unit_name() and (not seen or seen[-1] != unit.state):
                seen.append(unit.state)
            if unit.state == "ready":
                return

    watcher = asyncio.create_task(watch())
    # Subscribed before the unit exists: the agent holds the stream's queue.
    await eventually(lambda: len(h100.agent.monitor._watchers) == 1, what="the subscription")
    text = unit_text(port=free_port(), args="--start-delay 0.5 --load-delay 0.8")
    [result] = await h100.client.apply_units([UnitChange(unit_name(), text)])
    assert result.ok, result.error
    await asyncio.wait_for(watcher, 20)
    assert seen == ["starting", "loading", "ready"]
    [unit] = (await h100.client.report()).units
    assert unit.state == "ready" and unit.port is not None and unit.pid is not None
    assert unit.labels["X-Llmgw-Digest"] == "d1"


async def test_failed_unit_carries_its_log_tail(root: Path) -> None:
    settings = node_settings("cpu-only", root, supervise={"restart_limit": 0})
    async with serving(settings, root) as served:
        text = unit_text(port=free_port(), args="--exit-after 0.1 --exit-code 3")
        await served.client.apply_units([UnitChange(unit_name(), text)])

        async def failed() -> Unit | None:
            units = (await served.client.report()).units
            return units[0] if units and units[0].state == "failed" else None

        unit = await eventually(failed, what="the unit to fail")
        assert any("exiting with status 3 as asked" in line for line in unit.log_tail)
        assert "exited with status 3" in unit.detail
        assert len(await served.client.unit_logs(unit_name(), 2)) == 2
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await served.client.unit_logs("llmgw-nothing-r0-s0.service", 5)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_gpu_memory_held_by_others_marks_the_gpu(root: Path) -> None:
    node = root / "node"
    shutil.copytree(NODES / "faulty", node, ignore=shutil.ignore_patterns("state"))
    settings = node_settings("faulty", root, hardware={
        "sysfs_root": str(node / "sys"), "proc_root": str(node / "proc"),
        "nvidia_smi": str(node / "nvidia-smi"),
    })
    async with serving(settings, root) as served:
        worker_file = root / "worker.pid"
        text = unit_text(port=free_port(), args=f"--fork-worker --worker-pid-file {worker_file}")
        await served.client.apply_units([UnitChange(unit_name(), text)])
        worker = int(await eventually(lambda: worker_file.exists() and worker_file.read_text()))
        engine = (await served.client.report()).units[0].pid
        stranger = subprocess.Popen(["sleep", "30"])
        try:
            rows = (node / "query-gpu.csv").read_text().splitlines()
            uuids = [row.split(", ")[1] for row in rows]
            (node / "compute-apps.csv").write_text(
                f"{uuids[0]}, {engine}, python3, 40000\n"
                f"{uuids[1]}, {worker}, python3, 40000\n"
                f"{uuids[2]}, {stranger.pid}, /usr/bin/sleep, 1200\n"
            )
            gpus = (await served.client.report()).gpus
            assert [p.owned_by_llmgw for p in gpus[0].processes] == [True]
            assert [p.owned_by_llmgw for p in gpus[1].processes] == [True], "a forked worker"
            assert gpus[0].faults == [] and gpus[1].faults == []
            assert gpus[2].faults == [f"GPU 2 has memory held by pid {stranger.pid} "
                                      "(/usr/bin/sleep), not started by llmgw"]
            assert gpus[3].faults == ["GPU 3 has uncorrected ECC errors"]
        finally:
            stranger.kill()
            stranger.wait()


async def test_apply_is_per_unit_and_idempotent(h100: Served) -> None:
    text = unit_text(port=free_port())
    stub = agent_pb2_grpc.AgentStub(h100.channel)
    reply = await stub.ApplyUnits(pb.ApplyRequest(units=[
        pb.UnitChange(name=unit_name("x"), unit_text=unit_text("x")),  # no action
        pb.UnitChange(name=unit_name(), unit_text=text, action=pb.ACTION_START),
    ]))
    assert [(r.ok, r.changed) for r in reply.results] == [(False, False), (True, True)]
    assert "no action given" in reply.results[0].error
    [again] = await h100.client.apply_units([UnitChange(unit_name(), text)])
    assert again.ok and not again.changed


async def test_an_unknown_fabric_kind_is_invalid_argument(h100: Served) -> None:
    stub = agent_pb2_grpc.AgentStub(h100.channel)
    request = pb.ReportRequest(node="n", fabrics=[pb.DeclaredFabric(name="f", kind="ethernet")])
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Report(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown kind 'ethernet'" in (error.value.details() or "")


async def test_a_node_with_garbage_state_files_stays_reachable(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One bad byte in the state directory must not take the node out."""
    bad = root / "state" / "units" / unit_name("bad")
    bad.mkdir(parents=True)
    (bad / "unit").write_bytes(b"\xff\xfe\x00[Unit]\n")
    (bad / "pid").write_bytes(b"\x80\x81")
    odd = root / "state" / "units" / unit_name("odd")
    odd.mkdir(parents=True)
    (odd / "unit").write_text(unit_text("odd", port=free_port()))
    (odd / "pid").write_bytes(b"{\"pid\": \xff}")
    async with serving(node_settings("cpu-only", root), root) as served:
        report = await served.client.report()
        assert [u.name for u in report.units] == [unit_name("odd")]
        [unit] = report.units
        assert unit.state == "stopped"
    assert (root / "state" / "corrupt").is_dir()
    assert "moved its state aside" in caplog.text and "moved aside to pid.corrupt-" in caplog.text
