"""A node whose agent and engine run under a real systemd: ``llmgw serve`` end to end.

The node is a ``systemd-nspawn`` container with systemd 252 as PID 1 (the
``systemd_machine`` fixture) sharing this test's network. Its agent runs
there as a systemd service (``llmgw-agent.service``, ``backend: auto``
picks systemd), and the daemon reaches it as it reaches any node: over SSH
(the node's real sshd, on this side) to the agent's unix socket, which the
container's directory binding puts on both sides. The daemon plans Gemma 3
270M onto it; the agent writes the unit, systemd runs the real llama-server,
and the official ``openai`` client gets answers through the router.

Then someone runs ``systemctl stop`` on the node. With ``stopped_by_hand:
{repair: false}`` the replica is held stopped: systemd has forgotten the
unit by then (``ExecMainCode=0``), and only the agent's own evidence says an
operator stopped it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from ruamel.yaml import YAML
from support.machines import MachineFactory
from support.plugin import SimClusterFactory
from test_drift import DRIFT, held
from test_serve import Served, ready

from llmgw.onboarding import machines, simnodes

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
UNIT = "llmgw-gemma3-270m-r0-s0.service"

pytestmark = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are not built: run `make engine model` (make test does)",
)

GEMMA = {"gemma3-270m": {
    "source": str(MODEL.resolve()),
    "scaling": {"min": 1, "max": 1},
    "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1,
                  "args": {"ctx-size": 2048, "threads": 1, "parallel": 1, "no-jinja": True,
                           "chat-template": "gemma"}}],
}}


def accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
        return True


def wait_for(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def served(sim_cluster: SimClusterFactory, systemd_machine: MachineFactory,
           tmp_path: Path) -> Iterator[tuple[Served, machines.Machine]]:
    sim = sim_cluster(1, hardware=("cpu-only",), agents=False)
    node = next(iter(sim.nodes.values()))
    machine = systemd_machine(binds=[node.root], read_only=[ENGINE.resolve().parent,
                                                             MODEL.resolve().parent])
    config = {**simnodes.agent_config(node), "backend": "auto"}
    with node.agent_config.open("w") as out:
        YAML().dump(config, out)
    machines.start_agent(machine, node.agent_config, [str(ENGINE.resolve().parent)])
    wait_for(lambda: accepts(node.agent_socket), "the agent's socket, from inside the machine")
    serve = Served(sim.cluster_dir, tmp_path / "serve.log")
    sim.weights_dirs.append(str(MODEL.resolve().parent))  # a path source lies in weights_dirs
    path = sim.write_cluster({"models": GEMMA}) / "cluster.yaml"
    extra = ("  sync: auto\n  drift_interval: 1s\n  auth: none\n"
             f"  store: {{path: {sim.cluster_dir.parent / 'llmgw.db'}}}\n  listeners:\n"
             + "".join(f"    {k}: {v}\n" for k, v in serve.listeners().items()) + DRIFT)
    path.write_text(path.read_text().replace("cluster:\n", "cluster:\n" + extra, 1))
    serve.start()
    try:
        yield serve, machine
    finally:
        serve.stop()


def show(machine: machines.Machine, *props: str) -> dict[str, str]:
    out = machine.run(["systemctl", "show", "--property=" + ",".join(props), "--", UNIT])
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def test_serving_through_a_node_under_real_systemd(
    served: tuple[Served, machines.Machine],
) -> None:
    serve, machine = served
    serve.wait(ready({"gemma3-270m"}), "Gemma ready on the systemd node", timeout=300)

    # The engine is a systemd unit of the node, and its main process is llama-server.
    unit = show(machine, "ActiveState", "MainPID", "LoadState")
    assert (unit["LoadState"], unit["ActiveState"]) == ("loaded", "active"), unit
    comm = (machine.proc / unit["MainPID"] / "comm").read_text().strip()
    assert comm == "llama-server", comm
    agent = machine.run(["systemctl", "show", "--property=ActiveState", "--value", "--",
                         machines.AGENT_UNIT]).stdout.strip()
    assert agent == "active"

    client = openai.OpenAI(base_url=f"{serve.router}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["gemma3-270m"]
    chat = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8)
    assert chat.choices[0].message.content
    completion = client.completions.create(model="gemma3-270m",
                                           prompt="The capital of France is", max_tokens=8)
    assert completion.usage is not None and completion.usage.completion_tokens > 0

    # An operator's stop stands: held, not restarted, while the daemon plans on.
    machine.run(["systemctl", "stop", "--", UNIT])
    status = serve.wait(held("gemma3-270m", "stopped_by_hand"), "Gemma held, stopped by hand")
    [entry] = [h for h in status["plan"]["held"] if h["model"] == "gemma3-270m"]
    assert "stopped by someone other than llmgw" in entry["evidence"][0], entry
    iterations = status["iterations"]
    serve.wait(lambda s: s["iterations"] >= iterations + 3, "three more iterations")
    assert show(machine, "ActiveState")["ActiveState"] == "inactive"
