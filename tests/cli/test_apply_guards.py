"""``llmgw apply`` never duplicates what it cannot see, and does not race a daemon.

Real parts: a real agent process on a unix socket for the node that answers
(the other node's socket does not exist), real ``llmgw apply`` processes, the
cluster's real SQLite store and lease.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from ruamel.yaml import YAML

from llmgw.cli.main import main
from llmgw.daemon.leaders import Leadership
from llmgw.fleet.types import Unit
from llmgw.proto.conversions import UnitChange
from llmgw.spec import loading
from llmgw.store import stores
from llmgw.transport.agent_client import AgentClient

TESTS = Path(__file__).resolve().parents[1]
NODES = TESTS / "fixtures" / "nodes"
STUBS = TESTS / "support" / "bin"
TINY = {"source": "/models/tiny.gguf",
        "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1}]}


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="llmgw-g-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def closed_port() -> int:
    """A port nothing listens on: the kernel's choice, closed again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_cluster(root: Path, sync: str = "manual", up: str | None = None,
                  down: bool = False) -> Path:
    """One node: ``up`` (this machine, its agent's socket) or ``down`` (SSH to a closed port)."""
    directory = root / "cluster"
    directory.mkdir(exist_ok=True)
    nodes: dict[str, Any] = {}
    if up is not None:
        nodes["up"] = {"address": "local", "agent_socket": up, "weights_dirs": ["/models"]}
    if down:
        nodes["down"] = {"address": "127.0.0.1", "ssh_port": closed_port(),
                         "weights_dirs": ["/models"]}
    data: dict[str, Any] = {
        "cluster": {"name": "guards", "sync": sync, "store": {"path": str(root / "llmgw.db")},
                    "ssh": {"connect_timeout": "5s"}},
        "nodes": nodes,
        "models": {"tiny": TINY},
    }
    with (directory / "cluster.yaml").open("w") as handle:
        YAML().dump(data, handle)
    return directory


def agent_config(root: Path) -> Path:
    data = YAML(typ="safe").load((NODES / "cpu-only" / "agent.yaml").read_text())
    base = NODES / "cpu-only"
    data["hardware"] |= {"sysfs_root": str(base / "sys"), "proc_root": str(base / "proc"),
                         "nvidia_smi": str(base / "nvidia-smi")}
    data["declared"]["weights_dirs"] = [str(base / "models")]
    data |= {"node": "up", "socket": {"path": str(root / "up.sock"), "group": None},
             "state_dir": str(root / "state"),
             "readiness": {"poll_interval": "50ms", "probe_timeout": "1s"}}
    path = root / "agent.yaml"
    with path.open("w") as handle:
        YAML().dump(data, handle)
    return path


def environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{STUBS}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def agent(root: Path) -> Iterator[Path]:
    """A real agent for node ``up``; its socket. Its engines are removed after."""
    log = (root / "agent.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "agent", "serve", "--config", str(agent_config(root))],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=environment())
    path = root / "up.sock"
    try:
        asyncio.run(_answers(path))
        yield path
    finally:
        asyncio.run(_remove_all(path))
        process.terminate()
        process.wait(timeout=30)
        log.close()


async def _answers(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                await _units(path)
                return
            except grpc.aio.AioRpcError:
                pass
        await asyncio.sleep(0.1)
    pytest.fail(f"the agent on {path} did not answer within {timeout:.0f}s")


async def _units(path: Path) -> list[Unit]:
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        return list((await AgentClient(channel, timeout=20).report()).units)


async def _remove_all(path: Path) -> None:
    try:
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            client = AgentClient(channel, timeout=30)
            units = (await client.report()).units
            if units:
                await client.apply_units([UnitChange(u.name, "", action="remove") for u in units])
    except grpc.aio.AioRpcError:
        pass


def apply(directory: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "apply", "--cluster", str(directory), "--auto-approve",
         "--ready-timeout", "60s", *flags],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL, env=environment())


# ---- a node that does not answer -------------------------------------------------------


def test_a_max_1_model_that_may_run_on_a_node_down_is_not_created_elsewhere(
    root: Path, agent: Path,
) -> None:
    directory = write_cluster(root, up=str(agent), down=True)

    done = apply(directory)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "! down is unreachable" in done.stdout
    assert ("a replica may still run on down (unreachable): r0 not placed elsewhere (max 1); "
            "--force to place") in done.stdout
    assert "Plan: 0 to create" in done.stdout
    assert asyncio.run(_units(agent)) == [], "a second copy was created on the node that answers"

    forced = apply(directory, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "Plan: 1 to create, 0 to replace, 0 to destroy." in forced.stdout
    [unit] = asyncio.run(_units(agent))
    assert (unit.model, unit.state) == ("tiny", "ready")


# ---- a daemon that applies under sync: auto --------------------------------------------


@pytest.fixture
def leased(root: Path) -> Iterator[tuple[Path, str]]:
    """A cluster under sync: auto whose store's lease a daemon holds: (directory, holder)."""
    directory = write_cluster(root, sync="auto", up=str(root / "n1.sock"))
    cluster = loading.load(directory)

    async def take() -> str:
        store = await stores.open_store(cluster.cluster.store)
        try:
            leadership = Leadership(store, 300.0)
            await leadership.try_once()
            assert leadership.is_leader()
            return leadership.holder
        finally:
            await store.close()

    yield directory, asyncio.run(take())


def run_apply(directory: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    code = main(["apply", "--cluster", str(directory), "--auto-approve", *flags])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_apply_refuses_beside_a_daemon_without_a_terminal(
    leased: tuple[Path, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory, holder = leased
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    host, pid, _ = holder.split(":")
    code, out = run_apply(directory, capsys)
    assert code == 1
    assert f"! the daemon on {host} (pid {pid}) applies this cluster (sync: auto" in out
    assert (f"error: not applying beside the daemon on {host} (pid {pid}) (sync: auto): commit "
            "the change to the cluster directory") in out
    assert "--yes" in out
    assert "llmgw plan ·" not in out, "nothing is planned, no node is asked"


def test_apply_asks_at_a_terminal_and_yes_goes_on(
    leased: tuple[Path, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory, _ = leased
    terminal = io.StringIO("no\n")
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdin", terminal)
    code, out = run_apply(directory, capsys)
    assert code == 1 and "Apply cancelled" in out and "llmgw plan ·" not in out

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out = run_apply(directory, capsys, "--yes")
    assert "applies this cluster (sync: auto" in out  # still said
    assert "llmgw plan ·" in out and "! up is unreachable" in out
    assert code == 0, out


def test_no_warning_without_a_daemon(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    directory = write_cluster(root, sync="auto", up=str(root / "n1.sock"))
    code, out = run_apply(directory, capsys)  # nobody holds the lease
    assert code == 0 and "applies this cluster" not in out, out


def test_no_warning_under_sync_manual_where_the_daemon_only_plans(
    leased: tuple[Path, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, root: Path,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    directory = write_cluster(root, sync="manual", up=str(root / "n1.sock"))
    code, out = run_apply(directory, capsys)
    assert code == 0 and "applies this cluster" not in out, out
