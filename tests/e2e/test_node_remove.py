"""``llmgw node remove`` on real sshd nodes with real agents and stand-in engines.

The replica on the removed node is created on the other node and is Ready
before the old one's unit is removed; a node holding a model's only replica,
with nowhere to move it, is refused unless ``--force``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from support import engines as engines_support
from support import nodes
from support.engines import MODELS, pids
from support.plugin import SimClusterFactory

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


def test_remove_moves_the_replica_first_then_drops_the_node(
    sim_cluster: SimClusterFactory, engines: Path,
) -> None:
    sim = sim_cluster(2, hardware=("cpu-only", "cpu-only"))
    directory = sim.write_cluster({"models": engines_support.recording(TINY)})
    before = split_nodes(directory)
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
    assert after == HEADER + before[before.index("  node-02:"):]  # comments and order kept
    assert "-  node-01:  # rack 1" in out and "nodes.yaml node-01 removed; commit this" in out
    assert str(sim.nodes["node-01"].port) not in (directory / "known_hosts").read_text()
    # The fleet matches the cluster without node-01: nothing left to do.
    plan = llmgw(directory, "plan")
    assert "No changes" in plan.stdout, plan.stdout


def test_remove_refuses_to_strand_a_model_unless_forced(
    sim_cluster: SimClusterFactory, engines: Path,
) -> None:
    sim = sim_cluster(1, hardware=("cpu-only",))
    directory = sim.write_cluster({"models": engines_support.recording(TINY)})
    before = split_nodes(directory)
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
    assert (directory / "nodes.yaml").read_text() == HEADER.replace("nodes:\n", "nodes: {}\n")


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


pytestmark = pytest.mark.skipif(not shutil.which(nodes.SSHD),
                                reason="sshd not installed")
