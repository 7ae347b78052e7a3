"""Prefix routing measured with the engine's own counters, on two real llama-servers.

Two llama-server processes serve Gemma 3 270M behind the router. Five users,
each with a long system prompt of their own, ask three questions each, in
turns. llama.cpp reports in every answer how many prompt tokens it actually
evaluated (``timings.prompt_n``); the rest came from its prompt cache. With
least-outstanding routing a user's requests alternate between replicas, so
each replica evaluates the long prefix once per user; with prefix routing a
user stays on one replica and the prefix is evaluated once. Wall clock plays
no part: the comparison is of tokens the engines counted.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.stacks import CPU, Stack

from llmgw.router import Settings
from llmgw.spec.models import Cluster

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
pytestmark = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are built by `make engine model` (make test does)",
)

USERS = 5  # odd, so least-outstanding's turn-taking sends each user to both replicas
ROUNDS = 3
TOPICS = ("billing disputes", "warehouse safety", "tax filings", "flight bookings",
          "garden planning")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _system_prompt(topic: str) -> str:
    lines = [f"You are an assistant for {topic}. Rule {n}: answer about {topic} in one short "
             f"sentence, cite rule {n}, and never discuss anything but {topic}."
             for n in range(1, 13)]
    return "\n".join(lines)


class Engines:
    """Two llama-server processes on free ports, one thread each."""

    def __init__(self, tmp: Path) -> None:
        self.ports = [_free_port(), _free_port()]
        self.procs = []
        self.logs = [tmp / f"engine-{index}.log" for index in range(2)]
        for log, port in zip(self.logs, self.ports, strict=True):
            with log.open("w") as out:
                self.procs.append(subprocess.Popen(
                    [str(ENGINE), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
                     "-c", "8192", "-np", "4", "-t", "1", "--no-webui"],
                    stdout=out, stderr=subprocess.STDOUT,
                ))
        deadline = time.monotonic() + 120
        for port in self.ports:
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, self.logs[0].read_text()[-2000:]
                time.sleep(0.2)

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(10)


def _spec(policy: str) -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab", "auth": "none"},
        "models": {"gemma": {"profiles": CPU, "scaling": {"min": 1, "max": 2},
                             "routing": {"policy": policy}}},
    })


def _measure(tmp: Path, policy: str) -> dict[str, int]:
    engines = Engines(tmp)
    stack = Stack(tmp / policy, _spec(policy), Settings(), 0, None)
    try:
        stack.route({"gemma": engines.urls()})  # type: ignore[dict-item]
        evaluated = total = 0
        homes: dict[int, set[str]] = {}
        with httpx.Client(base_url=stack.url, timeout=120) as client:
            for round_ in range(ROUNDS):
                for user in range(USERS):
                    reply = client.post("/v1/chat/completions", json={
                        "model": "gemma", "max_tokens": 1, "temperature": 0,
                        "messages": [
                            {"role": "system", "content": _system_prompt(TOPICS[user])},
                            {"role": "user", "content": f"Question {round_ + 1}, please."},
                        ],
                    })
                    assert reply.status_code == 200, reply.text
                    body: dict[str, Any] = reply.json()
                    evaluated += int(body["timings"]["prompt_n"])
                    total += int(body["usage"]["prompt_tokens"])
                    homes.setdefault(user, set()).add(str(body.get("system_fingerprint")))
        return {"evaluated": evaluated, "prompt_tokens": total}
    finally:
        stack.close()
        engines.close()


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, int]]]:
    tmp = tmp_path_factory.mktemp("prefix")
    (tmp / "least-outstanding").mkdir()
    (tmp / "prefix").mkdir()
    yield {policy: _measure(tmp, policy) for policy in ("least-outstanding", "prefix")}


def test_prefix_routing_evaluates_fewer_prompt_tokens(
    measured: dict[str, dict[str, int]],
) -> None:
    least, prefix = measured["least-outstanding"], measured["prefix"]
    print("\nprompt tokens evaluated by the engines (timings.prompt_n), of all sent:")
    print(json.dumps(measured, indent=2))
    assert least["prompt_tokens"] == prefix["prompt_tokens"]  # the same requests both times
    # Each user's long prefix is evaluated on one replica instead of two.
    assert prefix["evaluated"] < 0.75 * least["evaluated"]
