"""``llmgw lab up --backend systemd``: each node's agent and engines under a real systemd.

The nodes' agents run as systemd services inside ``systemd-nspawn`` machines
(systemd 252 as PID 1), one per node; the cluster reaches them over each
node's sshd as before. An applied model's engine is a systemd unit of its
node's machine, and ``lab down`` leaves no machine, cgroup or engine behind.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import nodes

from llmgw.onboarding import labmachines, labs, machines
from llmgw.spec import loading
from llmgw.transport import pools

STUB_ENGINE = Path(__file__).resolve().parents[1] / "support" / "bin" / "llama-server"

pytestmark = [
    pytest.mark.skipif(not shutil.which(nodes.SSHD), reason="sshd not installed"),
    pytest.mark.skipif(machines.unavailable() is not None,
                       reason=f"no systemd machine here: {machines.unavailable()}"),
]


def llmgw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=180)


def cgroups_of(name: str) -> list[Path]:
    return [c for top in machines.cgroup_hierarchies()
            for c in top.glob(f"llmgw-machine-{name}-*")]


def unit_processes(name: str) -> dict[int, str]:
    """Processes of the machine ``name`` in an engine unit (not the agent's): pid → cgroup line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cgroup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if (f"llmgw-machine-{name}-" in line and "/system.slice/llmgw-" in line
                    and machines.AGENT_UNIT not in line):
                found[int(entry.name)] = line
    return found


def test_lab_nodes_run_their_agents_and_engines_under_systemd(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    up = llmgw("lab", "up", "--dir", "lab", "--model", str(model), "--engine", str(STUB_ENGINE),
               "--backend", "systemd", cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.count("systemd booted in") == 3, up.stdout
    runtime = (lab / labs.RUNTIME).resolve()
    names = {node: labmachines.machine_name(runtime, node) for node in ("gpu-01", "gpu-02",
                                                                         "cpu-01")}
    try:
        assert all(cgroups_of(name) for name in names.values())
        cluster = loading.load(lab / "cluster")
        fleet = asyncio.run(pools.collect(cluster, lab / "cluster"))
        assert {n: r.reachable for n, r in fleet.nodes.items()} == {
            "gpu-01": True, "gpu-02": True, "cpu-01": True}, fleet.nodes

        apply = subprocess.run([sys.executable, "-m", "llmgw", "apply", "--auto-approve"],
                               cwd=lab, text=True, capture_output=True, timeout=180)
        assert apply.returncode == 0, apply.stdout + apply.stderr
        engines = unit_processes(names["cpu-01"])
        assert engines, "no engine runs in a systemd unit of cpu-01's machine"
        assert all("llmgw-gemma3-270m-r0-s0.service" in line for line in engines.values())
        again = llmgw("lab", "up", "--dir", "lab", cwd=tmp_path)
        assert again.returncode == 0 and again.stdout.count("already running") == 3, again
    finally:
        down = llmgw("lab", "down", "--dir", "lab", "--purge", cwd=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(cgroups_of(name) for name in names.values())
    assert not any(unit_processes(name) for name in names.values())
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", 21200)) != 0
