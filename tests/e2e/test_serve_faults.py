"""``llmgw serve`` when things around it break: its own agent, its store, its ports.

The daemon runs as a real process on this machine's ``local`` node (the
agent it starts itself, the supervise backend, stand-in engines on PATH).
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import daemons, nodes
from support.engines import running

CLUSTER = """\
cluster:
  name: local
  sync: auto
  drift_interval: 1s
  auth: none
  listeners:
    router: 127.0.0.1:{router}
    admin: 127.0.0.1:{admin}
    metrics: 127.0.0.1:{metrics}
  store:
    path: {state}/llmgw.db
  agent_socket: {state}/agent.sock
nodes:
  local:
    address: local
    engine_ports_from: {engines}
    weights_dirs: [/models]
models:
  tiny:
    source: /models/tiny.gguf
    profiles:
      - engine: llama.cpp
        cpu: true
        min_memory_gb: 1
        env: {{TESTENGINE_RECORD_DIR: {records}}}
"""


class Local(daemons.Daemon):
    """A cluster directory for the local node and the ``llmgw serve`` run on it."""

    def __init__(self, tmp: Path, records: Path) -> None:
        directory, self.state = tmp / "cluster", tmp / "state"
        directory.mkdir()
        super().__init__(directory, tmp / "serve.log")
        (self.directory / "cluster.yaml").write_text(
            CLUSTER.format(state=self.state, records=records, engines=nodes.free_ports(32),
                           **self.ports))

    def run(self) -> subprocess.CompletedProcess[str]:
        """Run to its end (for refusals): exit status and output."""
        return subprocess.run(
            [sys.executable, "-m", "llmgw", "serve", "--cluster", str(self.directory)],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    def complete(self) -> httpx.Response:
        return httpx.post(f"{self.router}/v1/completions",
                          json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=10)

    def until_answered(self, what: str, timeout: float = 90) -> httpx.Response:
        def answered() -> httpx.Response | None:
            reply = self.complete()
            return reply if reply.status_code == 200 else None
        return self.until(answered, what, timeout, poll=0.3)


@pytest.fixture
def local(tmp_path: Path, engines: Path) -> Iterator[Local]:
    served = Local(tmp_path, engines)
    yield served
    served.stop()


def observed_reachable_after(local: Local, moment: float) -> bool:
    status = local.status()
    return bool(status["observed_at"] and status["observed_at"] > moment
                and status["nodes"]["local"]["reachable"])


def agents(config: Path) -> list[int]:
    """Pids of ``llmgw agent serve --config <config>`` processes alive now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(config).encode() in argv and b"agent" in argv and state != "Z":
            found.append(int(entry.name))
    return found


def test_a_killed_local_agent_is_restarted_and_requests_recover(
    local: Local, engines: Path
) -> None:
    local.start()
    local.until_answered("the first answer")
    config = local.state / "agent.yaml"
    (first,) = agents(config)
    engine = running(engines)["tiny"]["pid"]

    os.kill(first, signal.SIGKILL)
    # The daemon sees its agent die and starts another, which adopts the running engine.
    second = local.until(lambda: [p for p in agents(config) if p != first], "a new agent")[0]
    restarted = time.time()
    local.until(lambda: observed_reachable_after(local, restarted), "the node observed again")
    local.until_answered("answers after the agent was killed")
    assert agents(config) == [second]
    assert running(engines)["tiny"]["pid"] == engine  # adopted, not restarted
    log = local.log.read_text()
    assert "was killed by SIGKILL; restarting it in" in log, local.tail()

    # Stopping the daemon still stops the restarted agent and its engine.
    local.stop()
    assert agents(config) == [] and running(engines) == {}


def test_a_damaged_store_is_refused_before_anything_starts(local: Local, engines: Path) -> None:
    local.state.mkdir()
    store = local.state / "llmgw.db"
    store.write_bytes(b"\xff\xfe not an sqlite database \x00" * 100)

    result = local.run()

    assert result.returncode == 1, result.stderr
    assert f"error: {store}: the store is damaged or not an llmgw database" in result.stderr
    assert "Traceback" not in result.stderr
    assert agents(local.state / "agent.yaml") == []
    assert not (local.state / "agent.sock").exists() and running(engines) == {}
    with socket.create_server(("127.0.0.1", local.ports["router"])):
        pass  # nothing kept the router's port


def test_a_store_that_cannot_be_opened_is_refused(local: Local, engines: Path) -> None:
    (local.state / "llmgw.db").mkdir(parents=True)  # a directory where the file should be

    result = local.run()

    assert result.returncode == 1, result.stderr
    assert f"error: {local.state / 'llmgw.db'}: cannot open the store" in result.stderr
    assert agents(local.state / "agent.yaml") == []


def test_a_port_in_use_names_the_listener_and_where_to_change_it(
    local: Local, engines: Path
) -> None:
    with socket.create_server(("127.0.0.1", local.ports["admin"])):
        result = local.run()

    assert result.returncode == 1, result.stderr
    line = next(n for n, text in enumerate(
        (local.directory / "cluster.yaml").read_text().splitlines(), 1) if "admin:" in text)
    assert (f"error: cannot listen on 127.0.0.1:{local.ports['admin']} "
            "(cluster.listeners.admin): the port is in use") in result.stderr
    assert f"change cluster.listeners.admin at {local.directory}/cluster.yaml:{line}:" \
        in result.stderr
    assert agents(local.state / "agent.yaml") == [] and running(engines) == {}


def test_the_store_rejects_a_damaged_file_in_sqlite_terms(tmp_path: Path) -> None:
    """The message is ours, but the refusal is SQLite's: the file really is unusable."""
    path = tmp_path / "x.db"
    path.write_bytes(b"garbage" * 1000)
    with pytest.raises(sqlite3.DatabaseError):
        sqlite3.connect(path).execute("PRAGMA user_version").fetchone()
