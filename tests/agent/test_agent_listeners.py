"""Readiness proves the listener is the unit's own: a real agent, real engines, and a
real program of someone else's on the port the unit is given (ports from the kernel)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from agent_support import (
    eventually,
    free_port,
    node_settings,
    served_agent,
    short_dir,
    unit_name,
    unit_text,
)

from llmgw.agent import servers
from llmgw.fleet.types import Unit
from llmgw.proto.conversions import UnitChange
from llmgw.transport.agent_client import AgentClient

# A program that is not llmgw's and answers like an engine that has loaded m1: today's
# probes took it for the unit's engine ("ready after 0.0s").
IMPOSTOR = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = json.dumps({"status": "ok"} if self.path == "/health"
                          else {"data": [{"id": "m1"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
server = HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def impostor_running() -> Iterator[tuple[int, int]]:
    """(pid, port) of a program listening on a port the kernel chose; gone after."""
    process = subprocess.Popen([sys.executable, "-c", IMPOSTOR], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout is not None
        yield process.pid, int(process.stdout.readline())
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def impostor() -> Iterator[tuple[int, int]]:
    with impostor_running() as found:
        yield found


@pytest.fixture
async def agent() -> AsyncIterator[tuple[servers.Agent, AgentClient]]:
    root = short_dir()
    settings = node_settings("cpu-only", root, supervise={"restart_limit": 2})
    try:
        async with served_agent(settings, monitor=True) as served:
            yield served
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_unit_whose_port_another_program_holds_is_never_ready_and_names_it(
    agent: tuple[servers.Agent, AgentClient], impostor: tuple[int, int],
) -> None:
    _, client = agent
    pid, port = impostor
    seen: list[Unit] = []

    async def watch() -> Unit:
        async for unit in client.watch_units():
            if unit.name == unit_name():
                seen.append(unit)
                if unit.state == "failed":
                    return unit
        raise AssertionError("the watch ended")

    watcher = asyncio.create_task(watch())
    [result] = await client.apply_units([UnitChange(unit_name(), unit_text(port=port))])
    assert result.ok, result.error
    failed = await asyncio.wait_for(watcher, 20)
    assert [u.state for u in seen if u.state == "ready"] == []
    assert failed.detail.startswith(f"port {port} is held by pid {pid} (python")
    assert " -c import json, sys from http.server" in failed.detail
    assert "loading" not in failed.detail
    [reported] = [u for u in (await client.report()).units if u.name == unit_name()]
    assert reported.state == "failed" and f"held by pid {pid}" in reported.detail
    assert reported.port_holder.startswith(f"pid {pid} (python")  # what the planner reads


async def test_once_the_other_program_goes_the_unit_becomes_ready(
    agent: tuple[servers.Agent, AgentClient],
) -> None:
    _, client = agent
    with impostor_running() as (_, port):
        text = unit_text(port=port, service="Restart=always")
        text = text.replace("StartLimitIntervalSec=10s\n", "StartLimitIntervalSec=0\n")
        [result] = await client.apply_units([UnitChange(unit_name(), text)])
        assert result.ok, result.error

        async def held() -> Unit | None:
            units = [u for u in (await client.report()).units if u.name == unit_name()]
            return units[0] if units and "is held by pid" in units[0].detail else None

        unit = await eventually(held, what="the holder named")
        assert unit.state == "failed"

    async def ready() -> Unit | None:
        units = [u for u in (await client.report()).units if u.name == unit_name()]
        return units[0] if units and units[0].state == "ready" else None

    unit = await eventually(ready, timeout=30, what="the unit ready on its own engine")
    assert unit.detail == "" and unit.port_holder == ""


async def test_the_units_own_engine_is_ready_and_nothing_else_is_claimed(
    agent: tuple[servers.Agent, AgentClient],
) -> None:
    backend_agent, client = agent
    port = free_port()
    [result] = await client.apply_units([UnitChange(unit_name(), unit_text(port=port))])
    assert result.ok, result.error

    async def ready() -> Unit | None:
        units = [u for u in (await client.report()).units if u.name == unit_name()]
        return units[0] if units and units[0].state == "ready" else None

    unit = await eventually(ready, what="the unit ready")
    assert unit.pid is not None
    assert backend_agent.backend.unit_of(unit.pid) == unit_name()
    assert backend_agent.backend.unit_of(1) is None
