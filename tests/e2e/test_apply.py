"""``llmgw apply`` end to end: real sshd nodes, real agents, real engine processes.

The engines are the test engine behind stand-in ``vllm`` and ``llama-server``
binaries (tests/support/bin), so each test can read back the argv and the
environment that a rendered unit really started.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from support import engines as engines_support
from support import nodes
from support.engines import MODELS, running
from support.plugin import SimClusterFactory

from llmgw.cli.main import main
from llmgw.transport.agent_client import AgentClient


def apply(directory: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["apply", "--cluster", str(directory), "--auto-approve", "--ready-timeout", "60s",
                 *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def write(sim: nodes.SimCluster, models: dict[str, Any]) -> Path:
    return sim.write_cluster({"models": engines_support.recording(models)})


def argument(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_apply_creates_replaces_and_destroys(
    sim_cluster: SimClusterFactory, engines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sim_cluster(2, hardware=("h100-ib", "cpu-only"))
    directory = write(sim, MODELS)

    code, out = apply(directory, capsys)
    assert code == 0, out
    assert "Plan: 2 to create, 0 to replace, 0 to destroy." in out
    alive = running(engines)
    assert set(alive) == {"chat", "tiny"}
    chat = alive["chat"]
    assert argument(chat["argv"], "--tensor-parallel-size") == "2"
    assert argument(chat["argv"], "--max-model-len") == "8192"
    # GPUs pinned by UUID, two of them, from the fixture node's nvidia-smi.
    visible = chat["env"]["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 2 and all(v.startswith("GPU-") for v in visible)
    assert not any(k.startswith("NCCL_IB") for k in chat["env"]), "single node: no fabric"
    assert argument(alive["tiny"]["argv"], "--n-gpu-layers") == "0"

    # Applying an up-to-date cluster changes nothing.
    code, out = apply(directory, capsys)
    assert code == 0
    assert "No changes: the fleet matches the cluster." in out
    assert running(engines)["chat"]["pid"] == chat["pid"]

    # A changed engine argument replaces the replica; the old engine is gone.
    changed = json.loads(json.dumps(MODELS))
    changed["chat"]["profiles"][0]["args"]["max-model-len"] = 16384
    write(sim, changed)
    code, out = apply(directory, capsys)
    assert code == 0, out
    assert "Plan: 0 to create, 1 to replace, 0 to destroy." in out
    assert "max-model-len 8192 → 16384" in out
    alive = running(engines)
    assert argument(alive["chat"]["argv"], "--max-model-len") == "16384"
    assert alive["chat"]["pid"] != chat["pid"]
    assert alive["tiny"]["pid"] == running(engines)["tiny"]["pid"]

    # A removed model's units are gone, and so are its processes.
    del changed["chat"]
    write(sim, changed)
    code, out = apply(directory, capsys)
    assert code == 0, out
    assert "Plan: 0 to create, 0 to replace, 1 to destroy." in out
    assert set(running(engines)) == {"tiny"}
    assert main(["plan", "--cluster", str(directory), "--detailed-exitcode"]) == 0


def test_an_agent_killed_mid_apply_fails_that_node_and_a_rerun_converges(
    sim_cluster: SimClusterFactory, engines: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = sim_cluster(2, hardware=("h100-ib", "cpu-only"))
    directory = write(sim, MODELS)
    victim = sim.nodes["node-02"]  # the CPU node: it gets "tiny"
    monkeypatch.setenv("TESTENGINE_LOAD_DELAY", "4")
    directory = write(sim, MODELS)
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "apply", "--cluster", str(directory), "--auto-approve",
         "--ready-timeout", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while "tiny" not in running(engines):
            assert time.monotonic() < deadline, "the engine never started"
            time.sleep(0.1)
        victim.stop_agent(engines=False)  # the engine keeps loading; its agent is gone
        out, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, out
    assert "FAILED" in out and "node-02" in out
    assert "create chat r0: ok" in out  # the other node's change went through

    sim.start_agent(victim)  # back again: it re-adopts the engine it was running
    code, out = apply(directory, capsys)
    assert code == 0, out
    assert main(["plan", "--cluster", str(directory), "--detailed-exitcode"]) == 0
    capsys.readouterr()


def test_a_changed_host_key_is_refused_and_nothing_is_applied_there(
    sim_cluster: SimClusterFactory, engines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sim_cluster(2, hardware=("h100-ib", "cpu-only"))
    directory = write(sim, MODELS)
    impostor = sim.nodes["node-02"]
    impostor.rotate_host_key()
    impostor.restart_sshd()

    code, out = apply(directory, capsys)

    assert "! node-02 is unreachable, nothing will change there: host key" in out
    assert impostor.host_fingerprint() in out  # the key it offered, to check by hand
    assert units_on(impostor) == []  # nothing was applied behind the changed key
    # A replica may still run behind the changed key: apply does not place a second
    # copy of a max-bounded model elsewhere unless told to (planning/unseen.py).
    assert "a replica may still run on node-02" in out and "--force to place" in out
    assert set(running(engines)) == set()

    code, out = apply(directory, capsys, "--force")

    assert units_on(impostor) == []
    assert set(running(engines)) == {"chat", "tiny"}  # the honest node took both
    assert code == 0  # what could be applied was; the unreachable node is reported


def units_on(node: nodes.SimNode) -> list[str]:
    """The units a node's agent runs, asked straight over its socket (no SSH)."""

    async def ask() -> list[str]:
        async with grpc.aio.insecure_channel(f"unix:{node.agent_socket}") as channel:
            report = await AgentClient(channel, timeout=10).report()
        return [unit.name for unit in report.units]

    return asyncio.run(ask())


def test_a_remove_waits_for_an_engine_that_drains_longer_than_an_agent_call(
    sim_cluster: SimClusterFactory, engines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An engine may take up to its TimeoutStopSec to drain on SIGTERM; the agent answers
    the remove once it is done. A pool whose calls time out sooner must not call that
    remove failed (it used to: the replace said FAILED while the new replica served)."""
    from llmgw.applying import executions
    from llmgw.planning import plans
    from llmgw.spec import loading
    from llmgw.transport import pools

    sim = sim_cluster(1, hardware=("cpu-only",))
    draining = json.loads(json.dumps({"tiny": MODELS["tiny"]}))
    draining["tiny"]["profiles"][0]["env"] = {"TESTENGINE_STOP_DELAY": "4"}
    directory = write(sim, draining)
    code, out = apply(directory, capsys)
    assert code == 0, out
    pid = running(engines)["tiny"]["pid"]

    write(sim, {})

    async def destroy() -> executions.Outcome:
        cluster = loading.load(directory)
        async with pools.Pool(cluster, directory, call_timeout=2.0) as pool:
            plan = plans.plan(cluster, await pool.fleet(), time.time())
            assert plan.count("destroy") == 1, plan.summary()
            return await executions.execute(plan, pool, ready_timeout=30)

    outcome = asyncio.run(destroy())
    assert outcome.ok, outcome.summary()
    assert "tiny" not in running(engines), f"pid {pid} still serves"
