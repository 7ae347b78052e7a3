"""`llmgw agent serve` and `llmgw agent inventory` as real processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_support import NODES, alive, eventually, free_port, short_dir, unit_name, unit_text
from ruamel.yaml import YAML

from llmgw.cli.main import main
from llmgw.fleet.types import NodeReport
from llmgw.proto.conversions import UnitChange
from llmgw.transport.agent_client import AgentClient


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_config(root: Path, fixture: str = "cpu-only", **extra: Any) -> Path:
    """The fixture node's agent.yaml, copied next to a socket and state dir of our own."""
    data = YAML(typ="safe").load((NODES / fixture / "agent.yaml").read_text())
    base = NODES / fixture
    data["hardware"] |= {
        "sysfs_root": str(base / "sys"), "proc_root": str(base / "proc"),
    }
    if (base / "nvidia-smi").exists():
        data["hardware"]["nvidia_smi"] = str(base / "nvidia-smi")
    data["declared"]["weights_dirs"] = [str(base / "models")]
    data |= {
        "socket": {"path": str(root / "agent.sock"), "group": None},
        "state_dir": str(root / "state"),
        "readiness": {"poll_interval": "50ms", "probe_timeout": "1s"},
        **extra,
    }
    path = root / "agent.yaml"
    with path.open("w") as handle:
        YAML().dump(data, handle)
    return path


def llmgw(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args], capture_output=True, text=True, timeout=60,
        **kwargs,
    )


class AgentProcess:
    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llmgw", "agent", "serve", "--config", str(self.config)],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            )

    def signal(self, sig: signal.Signals) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=20)


async def connected(socket: Path) -> AgentClient:
    channel = grpc.aio.insecure_channel(f"unix:{socket}")
    client = AgentClient(channel, timeout=10)

    async def answers() -> bool:
        try:
            await client.report()
        except grpc.aio.AioRpcError:
            return False
        return True

    await eventually(answers, what="the agent to answer")
    return client


async def test_a_restarted_agent_adopts_running_engines(root: Path) -> None:
    config = write_config(root)
    agent = AgentProcess(config, root / "agent.log")
    agent.start()
    try:
        client = await connected(root / "agent.sock")
        worker_file = root / "worker.pid"
        text = unit_text(port=free_port(), args=f"--fork-worker --worker-pid-file {worker_file}")
        [result] = await client.apply_units([UnitChange(unit_name(), text)])
        assert result.ok, result.error

        async def ready_pid() -> int | None:
            units = (await client.report()).units
            return units[0].pid if units and units[0].state == "ready" else None

        pid = await eventually(ready_pid, what="ready")
        assert agent.signal(signal.SIGKILL) == -signal.SIGKILL  # no goodbye at all
        assert alive(pid), "the engine outlives its agent"

        agent.start()
        client = await connected(root / "agent.sock")
        assert await eventually(ready_pid, what="ready again") == pid, "adopted, not restarted"
        [again] = await client.apply_units([UnitChange(unit_name(), text)])
        assert again.ok and not again.changed
        starts = sum("llmgw: starting" in line for line in await client.unit_logs(unit_name(), 50))
        assert starts == 1

        worker = int(worker_file.read_text())
        [removed] = await client.apply_units([UnitChange(unit_name(), text, action="remove")])
        assert removed.ok and removed.changed
        assert not alive(pid)
        await eventually(lambda: not alive(worker), what="the worker gone with its group")
        assert agent.signal(signal.SIGTERM) == 0
        assert not (root / "agent.sock").exists(), "the socket is removed on a clean exit"
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
        for leftover in (root / "worker.pid",):
            if leftover.exists() and alive(int(leftover.read_text())):
                os.kill(int(leftover.read_text()), signal.SIGKILL)


async def test_stop_on_exit_stops_every_engine(root: Path) -> None:
    config = write_config(root, supervise={"stop_on_exit": True})
    agent = AgentProcess(config, root / "agent.log")
    agent.start()
    try:
        client = await connected(root / "agent.sock")
        await client.apply_units([UnitChange(unit_name(), unit_text(port=free_port()))])
        pid = await eventually(
            lambda: (root / "state/units" / unit_name() / "pid").exists()
            and json.loads((root / "state/units" / unit_name() / "pid").read_text())["pid"]
        )
        assert agent.signal(signal.SIGTERM) == 0
        assert not alive(pid)
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()


def inventory(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`llmgw agent inventory` through the real entry point, in this process."""
    code = main(["agent", "inventory", *args])
    out, err = capsys.readouterr()
    return code, out, err


def wait_for_socket(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
                return
            except OSError:
                time.sleep(0.05)
    pytest.fail(f"nothing listens on {path}")


def test_inventory_collects_locally_when_no_agent_runs(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = inventory(capsys, "--config", str(write_config(root, "faulty")))
    assert code == 0, err
    assert "collected here" in out
    assert "GPUs      8 × h100-80g; 2 unhealthy" in out
    assert "GPU 3 has uncorrected ECC errors" in out
    assert "GPU 6 has memory held by pid 48213 (/opt/conda/bin/python3)" in out
    assert "ib-a (infiniband): advertised over mlx5_0, mlx5_1, mlx5_3" in out
    assert "mlx5_2 has no ACTIVE port (port 1: INIT, LinkUp)" in out
    assert not (root / "state").exists(), "inventory is read-only"


def test_inventory_json_is_a_node_report(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = inventory(capsys, "--json", "--config", str(write_config(root, "old-driver")))
    assert code == 0, err
    report = NodeReport.model_validate_json(out)
    assert [g.utilization_pct for g in report.gpus] == [None] * 4
    assert [g.gpu_class for g in report.gpus] == ["a100-40g"] * 4
    [fabric] = report.fabrics
    assert not fabric.advertised and "mlx5_0 is declared but not present" in fabric.reasons[0]


def test_inventory_asks_the_running_agent(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(root, "l40s-nofabric")
    agent = AgentProcess(config, root / "agent.log")
    agent.start()
    try:
        wait_for_socket(root / "agent.sock")
        code, out, err = inventory(capsys, "--config", str(config))
        assert code == 0, err
        assert f"from the agent on unix:{root / 'agent.sock'}" in out
        assert "GPUs      4 × l40s-45g" in out
        code, out, err = inventory(capsys, "--local", "--config", str(config))
        assert "collected here" in out
    finally:
        agent.signal(signal.SIGTERM)


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("socket:\n  mode: rw\n", "agent.yaml:2:3: socket.mode: Value error, mode must be octal"),
        ("backend: docker\n", "agent.yaml:1:1: backend: Input should be 'auto', 'systemd'"),
        ("hardware:\n  nvml: [on\n", "agent.yaml:3:1: expected ',' or ']'"),
        ("readiness:\n  poll_interval: soon\n", "readiness.poll_interval: Value error, invalid"),
        ("sockets: {}\n", "agent.yaml:1:1: sockets: Extra inputs are not permitted"),
    ],
)
@pytest.mark.parametrize("command", ["inventory", "serve"])
def test_bad_settings_say_where_and_what(
    root: Path, capsys: pytest.CaptureFixture[str], command: str, yaml: str, message: str
) -> None:
    (root / "agent.yaml").write_text(yaml)
    assert main(["agent", command, "--config", str(root / "agent.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_serve_refuses_a_socket_another_agent_serves(root: Path) -> None:
    config = write_config(root)
    first = AgentProcess(config, root / "agent.log")
    first.start()
    try:
        sock = root / "agent.sock"
        wait_for_socket(sock)
        done = llmgw("agent", "serve", "--config", str(config))
        assert done.returncode == 1
        assert f"error: another agent is already serving on {sock}" in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        first.signal(signal.SIGTERM)
    assert os.path.exists(config)


async def test_sigterm_ends_watch_streams_and_exits(root: Path) -> None:
    agent = AgentProcess(write_config(root), root / "agent.log")
    agent.start()
    try:
        client = await connected(root / "agent.sock")
        await client.apply_units([UnitChange(unit_name(), unit_text(port=free_port()))])
        seen: list[str] = []

        async def watch() -> None:
            async for unit in client.watch_units():
                seen.append(unit.state)

        watcher = asyncio.create_task(watch())
        await eventually(lambda: seen, what="the first event")
        assert agent.signal(signal.SIGTERM) == 0
        await asyncio.wait_for(watcher, 10)  # the stream ended; it did not hang
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
        state = root / "state/units" / unit_name() / "pid"
        if state.exists():
            os.kill(json.loads(state.read_text())["pid"], signal.SIGKILL)
