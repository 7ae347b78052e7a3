"""Shared helpers for the agent's tests (imported as `agent_support`): engine, ports, units."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "support" / "testengine.py"
NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unit_text(
    model: str = "m1",
    replica: int = 0,
    rank: int = 0,
    port: int | None = None,
    args: str = "",
    service: str = "",
    digest: str = "d1",
) -> str:
    """A unit with exactly the keys llmgw's template writes (the agent refuses any other
    shape), running the test engine.

    ``service`` holds extra ``[Service]`` lines: a key the template writes once
    (``TimeoutStopSec=0.3``) replaces its default; ``Environment=`` lines are added.
    The start limit is on (``StartLimitIntervalSec=10s``) unless a test turns it off.
    """
    name = f"llmgw-{model}-r{replica}-s{rank}.service"
    port_label = f"X-Llmgw-Port={port}\n" if port is not None else ""
    port_arg = f" --port {port}" if port is not None else ""
    settings = {
        "Type": "exec",
        "ExecStart": f"{sys.executable} {ENGINE} serve {model}{port_arg} {args}",
        "EnvironmentFile": f"-/etc/llmgw/env/{name}.env\n"
                           f"EnvironmentFile=-/etc/llmgw/env/{name}.secret.env",
        "KillMode": "control-group", "TimeoutStopSec": "5", "Restart": "on-failure",
        "RestartSec": "0", "LimitNOFILE": "1048576", "LimitMEMLOCK": "infinity",
    }
    extra = []
    for line in service.splitlines():
        key, _, value = line.partition("=")
        if key in settings:
            settings[key] = value
        elif line:
            extra.append(line)
    return (
        "[Unit]\n"
        f"Description=llmgw {model} replica {replica} shard {rank} (vllm)\n"
        "After=network-online.target\nWants=network-online.target\n"
        "StartLimitIntervalSec=10s\n"
        f"X-Llmgw-Model={model}\nX-Llmgw-Replica={replica}\nX-Llmgw-Rank={rank}\n"
        f"X-Llmgw-Digest={digest}\n{port_label}"
        'X-Llmgw-Spec={"v":1}\n'
        "\n[Service]\n"
        + "".join(f"{key}={value}\n" for key, value in settings.items())
        + "".join(f"{line}\n" for line in extra)
    )


def unit_name(model: str = "m1", replica: int = 0, rank: int = 0) -> str:
    return f"llmgw-{model}-r{replica}-s{rank}.service"


async def eventually(
    check: Callable[[], Awaitable[T | None] | T | None], timeout: float = 15.0, what: str = ""
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result  # type: ignore[misc]
        if result:
            return result  # type: ignore[return-value]
        last = result
        await asyncio.sleep(0.05)
    pytest.fail(f"timed out waiting for {what or check}: last {last!r}")


def alive(pid: int) -> bool:
    """A live process (zombies count as dead: PID 1 here may never reap them)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def short_dir() -> Path:
    """A fresh directory with a short path: a unix socket path must fit in 108 bytes."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="llmgw-t-", dir="/tmp"))


def node_settings(fixture: str, root: Path, **overrides: Any) -> Any:
    """A fixture node's agent settings, with its socket and state under ``root``."""
    from llmgw.agent import settings

    data = settings.load(NODES / fixture / "agent.yaml").model_dump()
    data["socket"] = {"path": str(root / "agent.sock"), "mode": "0660", "group": None}
    data["state_dir"] = str(root / "state")
    data["readiness"] = {"poll_interval": 0.05, "probe_timeout": 1.0}
    data["supervise"] = {"restart_backoff": 0.05, "restart_backoff_max": 0.2, "stop_timeout": 2.0}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return settings.Settings.model_validate(data)


@contextlib.asynccontextmanager
async def served_agent(settings: Any, *, monitor: bool = False,
                       timeout: float = 20) -> AsyncIterator[tuple[Any, Any]]:
    """An agent served in this process on its unix socket, with a gRPC client to it; at
    the end every unit it runs is removed (engines outlive an agent otherwise) and it stops.
    ``monitor`` runs its unit monitor too, as ``llmgw agent serve`` does."""
    import grpc

    from llmgw.agent import servers
    from llmgw.proto.conversions import UnitChange
    from llmgw.transport.agent_client import AgentClient

    agent = servers.Agent(settings)
    server = await servers.start(agent)
    watching = asyncio.create_task(agent.monitor.run()) if monitor else None
    channel = grpc.aio.insecure_channel(f"unix:{settings.socket.path}")
    try:
        yield agent, AgentClient(channel, timeout=timeout)
    finally:
        # A fresh look, not monitor.units: that snapshot may predate the last apply.
        names = [u.name for u in await agent.monitor.refresh()]
        await agent.apply([UnitChange(n, "", action="remove") for n in names])
        await channel.close()
        await server.stop(None)
        if watching is not None:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        await agent.close()
