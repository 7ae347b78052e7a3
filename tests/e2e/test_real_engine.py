"""The whole loop with the real engine: llama-server serving Gemma 3 270M on this CPU.

Runs what ``make run`` runs (``cluster.example/local``, copied so the test can
edit it), then: ``llmgw plan`` shows no changes → completion, chat and a
streamed reply through the router with the official ``openai`` client → an
edited engine argument replaces the replica and the new one answers → the
model removed → 404 → its engine process is gone → Ctrl-C leaves nothing.

``make test`` builds the engine and the model first; run outside it, the
test is skipped with the command that provides them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support import daemons, nodes

from llmgw.cli.main import main

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"

pytestmark = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are not built: run `make engine model` (make test does)",
)


def engine_processes() -> dict[int, list[str]]:
    """Every llama-server on this machine: pid → argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"llama-server"):
            found[int(entry.name)] = [a.decode() for a in argv if a]
    return found


@pytest.fixture
def local_cluster(tmp_path: Path) -> Path:
    """cluster.example/local with absolute paths into the repo and free ports."""
    directory = tmp_path / "local"
    directory.mkdir()
    text = (ROOT / "cluster.example" / "local" / "cluster.yaml").read_text()
    ports = {name: nodes.free_port() for name in ("router", "admin", "metrics")}
    for name, default in (("router", 8000), ("admin", 8001), ("metrics", 9400)):
        text = text.replace(f"{name}: 127.0.0.1:{default}", f"{name}: 127.0.0.1:{ports[name]}")
    text = text.replace("    address: local\n", "    address: local\n"
                        f"    engine_ports_from: {nodes.free_ports(32)}\n")
    text = text.replace("../../.cache/models", str(MODEL.parent))
    text = text.replace("../../.cache/local/", f"{tmp_path}/state/")
    (directory / "cluster.yaml").write_text(text)
    return directory


@pytest.fixture
def daemon(local_cluster: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    env = {**os.environ, "PATH": f"{ENGINE.parent}{os.pathsep}{os.environ['PATH']}"}
    text = (local_cluster / "cluster.yaml").read_text()
    ports = {name: int(text.split(f"{name}: 127.0.0.1:")[1].split()[0])
             for name in daemons.LISTENERS}
    served = daemons.Daemon(local_cluster, tmp_path / "serve.log", env=env, ports=ports)
    process = served.start()
    info = {"daemon": served, "process": process, "router": served.router,
            "admin": served.admin, "dir": local_cluster, "log": served.log, "env": env}
    try:
        yield info
    finally:
        served.stop(signal.SIGINT)


def wait_status(
    info: dict[str, Any], check: Any, what: str, timeout: float = 120
) -> dict[str, Any]:
    return info["daemon"].wait(check, what, timeout, poll=0.3)  # type: ignore[no-any-return]


def ready(status: dict[str, Any]) -> bool:
    return any(r["state"] == "ready" for r in status["replicas"]) and not (
        status["plan"] or {}).get("has_changes", True)


def test_the_whole_loop_with_a_real_engine(
    daemon: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wait_status(daemon, ready, "the model to be ready")
    first = {pid: argv for pid, argv in engine_processes().items() if str(MODEL) in argv}
    assert len(first) == 1
    (pid, argv), = first.items()
    assert argv[argv.index("--ctx-size") + 1] == "2048"

    # The live plan through the local socket: nothing to do.
    monkeypatch.setenv("PATH", daemon["env"]["PATH"])
    assert main(["plan", "--cluster", str(daemon["dir"]), "--detailed-exitcode"]) == 0
    assert "Plan: 0 to create, 0 to replace, 0 to destroy." in capsys.readouterr().out

    client = openai.OpenAI(base_url=f"{daemon['router']}/v1", api_key="unused", max_retries=0)
    models = [m.id for m in client.models.list()]
    assert models == ["gemma3-270m"]
    completion = client.completions.create(model="gemma3-270m",
                                           prompt="The capital of France is", max_tokens=8)
    assert completion.choices[0].text.strip()
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    chat = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
    )
    assert chat.choices[0].message.content
    pieces = [
        chunk.choices[0].text
        for chunk in client.completions.create(model="gemma3-270m", prompt="One, two,",
                                               max_tokens=8, stream=True)
        if chunk.choices
    ]
    assert len(pieces) > 1 and "".join(pieces).strip()

    # Edit an engine argument: the replica is replaced, and the new one answers.
    path = daemon["dir"] / "cluster.yaml"
    path.write_text(path.read_text().replace("ctx-size: 2048", "ctx-size: 1024"))
    wait_status(daemon, lambda s: ready(s) and pid not in engine_processes(), "the replacement")
    (new_pid, new_argv), = ((p, a) for p, a in engine_processes().items() if str(MODEL) in a)
    assert new_pid != pid
    assert new_argv[new_argv.index("--ctx-size") + 1] == "1024"
    again = client.completions.create(model="gemma3-270m", prompt="Hello", max_tokens=4)
    assert again.choices[0].text is not None

    # Remove the model: 404, and its engine is gone.
    text = path.read_text()
    path.write_text(text[: text.index("models:")])
    wait_status(daemon, lambda s: not s["replicas"], "the model's removal")
    with pytest.raises(openai.NotFoundError, match="model not found"):
        client.completions.create(model="gemma3-270m", prompt="Hello", max_tokens=4)
    assert new_pid not in engine_processes()

    # Ctrl-C stops the daemon and the agent it started; nothing is left running.
    daemon["process"].send_signal(signal.SIGINT)
    assert daemon["process"].wait(timeout=60) == 0
    state = Path(str(daemon["dir"]).replace("/local", "/state"))
    assert not any(str(state) in " ".join(a) for a in _processes().values())


def _processes() -> dict[int, list[str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
    return found
