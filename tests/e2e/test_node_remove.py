"""``llmgw node remove`` on real sshd nodes with real agents and stand-in engines.

The replica on the removed node is created on the other node and is Ready
before the old one's unit is removed; a node holding a model's only replica,
with nowhere to move it, is refused unless ``--force``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from support import engines as engines_support
from support import nodes
from support.engines import MODELS, pids
from support.plugin import SimClusterFactory

from llmgw.onboarding import simenrolments

TINY = {"tiny": MODELS["tiny"]}
HEADER = "# Our machines (`llmgw node add` writes here).\nnodes:\n"


def llmgw(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args, "--cluster", str(directory)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def split_nodes(directory: Path) -> str:
    """Move the nodes from cluster.yaml into a commented nodes.yaml, as `node add` keeps it."""
    yaml = YAML()
    data = yaml.load((directory / "cluster.yaml").read_text())
    found = data.pop("nodes")
    with (directory / "cluster.yaml").open("w") as out:
        yaml.dump(data, out)
    lines = [HEADER]
    for name, spec in found.items():
        lines.append(f"  {name}:  # rack {name[-1]}\n")
        lines += [f"    {k}: {v}\n" for k, v in spec.items()]
    text = "".join(lines)
    (directory / "nodes.yaml").write_text(text)
    return text


@pytest.mark.timeout(1500)  # node add installs llmgw on each node first
def test_remove_moves_the_replica_first_then_drops_the_node(
    enrolled_cluster: SimClusterFactory, engines: Path,
) -> None:
    sim = enrolled_cluster(2)
    directory = sim.write_cluster({"models": engines_support.recording(TINY)})
    before = (directory / "nodes.yaml").read_text()  # as node add wrote it
    applied = llmgw(directory, "apply", "--auto-approve", "--ready-timeout", "60s")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "s0 node-01  port" in applied.stdout, applied.stdout
    old = pids(engines)["tiny"]

    removed = llmgw(directory, "node", "remove", "node-01", "--ready-timeout", "60s")
    out = removed.stdout
    assert removed.returncode == 0, out + removed.stderr
    assert "plan       1 unit on node-01; 1 replica to move first" in out
    assert "+    drain: true" in out  # the draining state, written and shown first
    # Create before destroy: the new replica on node-02 is Ready before node-01's unit goes.
    ready = out.index("node-02  llmgw-tiny-r1-s0.service  ready")
    gone = out.index("node-01  llmgw-tiny-r0-s0.service  removed")
    assert ready < gone, out
    new = pids(engines)
    assert set(new) == {"tiny"} and new["tiny"] != old
    assert not nodes._alive(old)

    after = (directory / "nodes.yaml").read_text()
    assert after == "nodes:\n" + before[before.index("  node-02:"):]  # order kept
    assert "-  node-01:" in out and "nodes.yaml node-01 removed; commit this" in out
    assert str(sim.nodes["node-01"].port) not in (directory / "known_hosts").read_text()
    # The fleet matches the cluster without node-01: nothing left to do.
    plan = llmgw(directory, "plan")
    assert "No changes" in plan.stdout, plan.stdout


@pytest.mark.timeout(1500)  # node add installs llmgw on each node first
def test_remove_refuses_to_strand_a_model_unless_forced(
    enrolled_cluster: SimClusterFactory, engines: Path,
) -> None:
    sim = enrolled_cluster(1)
    directory = sim.write_cluster({"models": engines_support.recording(TINY)})
    before = (directory / "nodes.yaml").read_text()
    assert llmgw(directory, "apply", "--auto-approve").returncode == 0
    serving = pids(engines)["tiny"]

    refused = llmgw(directory, "node", "remove", "node-01")
    assert refused.returncode == 1
    assert ("removing node-01 would leave models unservable; nothing was changed:\n"
            "  - tiny: r0 fits on no other node, and no replica runs elsewhere") in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (directory / "nodes.yaml").read_text() == before
    assert pids(engines) == {"tiny": serving}

    forced = llmgw(directory, "node", "remove", "node-01", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "1 with nowhere to go (--force)" in forced.stdout
    assert "units      1 removed from node-01: llmgw-tiny-r0-s0.service" in forced.stdout
    assert pids(engines) == {} and not nodes._alive(serving)
    assert (directory / "nodes.yaml").read_text() == "nodes: {}\n"


def test_remove_names_what_it_cannot_find(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, hardware=("cpu-only",))
    directory = sim.write_cluster()
    split_nodes(directory)
    unknown = llmgw(directory, "node", "remove", "node-09")
    assert unknown.returncode == 1 and "no node named 'node-09' there" in unknown.stderr
    sim.nodes["node-01"].stop_sshd()
    down = llmgw(directory, "node", "remove", "node-01")
    assert down.returncode == 1 and "node-01 is unreachable" in down.stderr
    assert "pass --force" in down.stderr and "node-01" in (directory / "nodes.yaml").read_text()




def within(seconds: float, check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stopped_agent(node: nodes.SimNode) -> int:
    pid = node.enrolled_agent()
    assert pid is not None, "node add started no agent"
    return pid


@pytest.mark.timeout(1200)
def test_uninstall_through_the_agent_as_an_account_without_shell(
    enrolled_cluster: SimClusterFactory,
) -> None:
    sim = enrolled_cluster(1)
    node = sim.nodes["node-01"]
    directory = sim.write_cluster()
    prefix = simenrolments.prefix_of(node)
    agent = stopped_agent(node)
    nodes_yaml, known_hosts = ((directory / f).read_text() for f in ("nodes.yaml",
                                                                     "known_hosts"))

    # An install node add did not make is not deleted: refused before any change.
    marker = prefix / "etc" / "llmgw-agent.service"
    kept = marker.read_text()
    marker.unlink()
    refused = llmgw(directory, "node", "remove", "node-01", "--uninstall")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "node-01: its agent cannot be stopped (no install of `llmgw node add` found " \
        "here" in refused.stderr, refused.stderr
    assert "nothing was changed" in refused.stderr and "Traceback" not in refused.stderr
    assert (directory / "nodes.yaml").read_text() == nodes_yaml
    assert (directory / "known_hosts").read_text() == known_hosts
    assert nodes._alive(agent) and prefix.exists()
    marker.write_text(kept)

    removed = llmgw(directory, "node", "remove", "node-01", "--uninstall")
    out = removed.stdout
    assert removed.returncode == 0, out + removed.stderr
    assert "units      none left on node-01" in out
    assert ("agent      stopped (supervise backend: nothing starts it again); it deletes "
            f"{prefix} as it exits") in out, out
    assert ("left       for root on the node, where node add made them (the agent does not "
            f"remove them):\n             userdel -r {sim.account}\n") in out, out
    # Its socket answers no more once it stopped serving; the process and its prefix go
    # a moment later, as it exits.
    assert within(120, lambda: not nodes._alive(agent) and not prefix.exists())
    assert out.index("agent      stopped") < out.index("nodes.yaml node-01 removed")
    assert (directory / "nodes.yaml").read_text() == "nodes: {}\n"
    assert str(node.port) not in (directory / "known_hosts").read_text()


@pytest.mark.timeout(1500)
def test_remove_installs_the_engine_version_its_moves_need(
    enrolled_cluster: SimClusterFactory, engines: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stand_in = engines_support.shippable(tmp_path / "ship")
    monkeypatch.setenv("PATH", f"{stand_in}:{os.environ['PATH']}")  # what node remove ships
    sim = enrolled_cluster(2)
    models = engines_support.recording(TINY)
    models["tiny"]["profiles"][0]["engine_version"] = "11434.0.0"
    directory = sim.write_cluster({"models": models})
    applied = llmgw(directory, "apply", "--auto-approve", "--ready-timeout", "60s")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "node-01  installed llama.cpp 11434.0.0" in applied.stdout, applied.stdout
    second = simenrolments.prefix_of(sim.nodes["node-02"]) / "engines" / "llama.cpp-11434.0.0"
    assert not second.exists()

    removed = llmgw(directory, "node", "remove", "node-01", "--ready-timeout", "60s")
    out = removed.stdout
    assert removed.returncode == 0, out + removed.stderr
    assert "install    engine versions the moves need, first:" in out
    assert f"  node-02  installed llama.cpp 11434.0.0 in {second}" in out, out
    assert out.index("install    engine") < out.index("nodes.yaml node-01 draining")
    assert "node-02  llmgw-tiny-r1-s0.service  ready" in out, out
    assert (second / "bin" / "llama-server").exists()
    assert "node-01" not in (directory / "nodes.yaml").read_text()
