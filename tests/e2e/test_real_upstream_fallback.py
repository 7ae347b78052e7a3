"""An upstream as a model's fallback, with two real llama-servers (Gemma 3 270M).

``llmgw serve`` runs ``cluster.example/local`` (its one replica, placed by
llmgw) with ``upstreams: {backup: ...}``: a second llama-server started by
hand here, behind its own ``--api-key``, the model's ``fallback``. The
replica's engine is killed, the way a crash stops it; the official openai
client's requests keep succeeding, answered by the upstream (its key sent,
the router's ``llmgw_upstream_requests_total{upstream="backup"}`` counts
them), with no error to the client.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import daemons, llamaservers, nodes

from llmgw.spec import statedirs

ROOT = Path(__file__).parents[2]
KEY = "sk-backup-0c5e7f"

pytestmark = pytest.mark.skipif(not llamaservers.BUILT, reason=llamaservers.NOT_BUILT)


@pytest.fixture
def backup(tmp_path: Path) -> Iterator[str]:
    """The upstream: a llama-server llmgw did not start, which wants a key."""
    with llamaservers.serving(tmp_path / "backup.log", "--api-key", KEY, "--no-jinja",
                              "--chat-template", "gemma") as url:
        yield url


@pytest.fixture
def daemon(tmp_path: Path, backup: str) -> Iterator[daemons.Daemon]:
    directory = tmp_path / "local"
    directory.mkdir()
    ports = {name: nodes.free_port() for name in daemons.LISTENERS}
    text = (ROOT / "cluster.example" / "local" / "cluster.yaml").read_text()
    for name, default in (("router", 8000), ("admin", 8001), ("metrics", 9400)):
        text = text.replace(f"{name}: 127.0.0.1:{default}", f"{name}: 127.0.0.1:{ports[name]}")
    engine_ports = nodes.free_ports(32)
    text = text.replace("    address: local\n", "    address: local\n"
                        f"    engine_ports_from: {engine_ports}\n")
    text = text.replace("../../.cache/models", str(llamaservers.MODEL.parent))
    text = text.replace("../../.cache/local/", f"{tmp_path}/state/")
    text += f"""
upstreams:
  backup:
    url: {backup}
    api_key_file: backup.key        # relative: in the state directory
    health: {{interval: 1s, timeout: 2s, max_backoff: 2s}}
    models:
      gemma3-270m: {{model: gemma, use: fallback}}
"""
    (directory / "cluster.yaml").write_text(text)
    key = Path(os.environ[statedirs.ENV]) / "backup.key"  # this test's state directory
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    env = {**os.environ,
           "PATH": f"{llamaservers.ENGINE.parent}{os.pathsep}{os.environ['PATH']}"}
    served = daemons.Daemon(directory, tmp_path / "serve.log", env=env, ports=ports)
    served.engine_ports = range(engine_ports, engine_ports + 32)  # type: ignore[attr-defined]
    served.start()
    try:
        yield served
    finally:
        served.stop(signal.SIGINT)


def replica_engines(ports: range) -> list[int]:
    """Pids of the llama-servers this test's llmgw started: on its engine ports (other
    tests may run engines of their own; the hand-started upstream is on another port)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (argv[0].endswith(b"llama-server") and b"--port" in argv
                    and int(argv[argv.index(b"--port") + 1]) in ports):
                found.append(int(entry.name))
    return found


def upstream_requests(daemon: daemons.Daemon) -> float:
    text = httpx.get(daemon.metrics + "/metrics", timeout=5).text
    found = re.search(r'^llmgw_upstream_requests_total\{upstream="backup"\} (\S+)$', text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def ask(client: openai.OpenAI) -> str:
    chat = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4, temperature=0)
    return chat.choices[0].message.content or ""


def test_the_upstream_answers_while_the_only_replica_is_stopped(
        daemon: daemons.Daemon) -> None:
    def ready(status: dict[str, Any]) -> bool:
        return any(r["state"] == "ready" for r in status["replicas"])

    daemon.wait(ready, "the replica to be ready", timeout=180, poll=0.3)
    daemon.until(lambda: "llmgw_upstream_up{upstream=\"backup\"} 1.0" in httpx.get(
        daemon.metrics + "/metrics", timeout=5).text, "the upstream to be up")
    client = openai.OpenAI(base_url=f"{daemon.router}/v1", api_key="unused", max_retries=0)
    assert ask(client)
    assert upstream_requests(daemon) == 0  # a fallback: the replica answered

    (engine,) = replica_engines(daemon.engine_ports)  # type: ignore[attr-defined]
    os.kill(engine, signal.SIGKILL)  # the only replica stops
    answers = []
    for _ in range(4):
        answers.append(ask(client))  # raises on any client error
        time.sleep(0.5)
    assert all(answers)
    served = upstream_requests(daemon)
    assert served >= 1, daemon.tail()
    text = httpx.get(daemon.metrics + "/metrics", timeout=5).text
    assert 'llmgw_upstream_failures_total{upstream="backup"} 0.0' in text
    assert KEY not in daemon.log.read_text()
