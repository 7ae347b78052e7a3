"""``llmgw lab``: nodes outlive the command, the cluster reaches them, down leaves nothing."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import nodes

from llmgw.onboarding import enrolments, labs, processes, simenrolments
from llmgw.spec import loading
from llmgw.transport import pools

WHEELS = Path(__file__).resolve().parents[2] / ".cache" / "wheels"
STUB_ENGINE = Path(__file__).resolve().parents[1] / "support" / "bin" / "llama-server"

pytestmark = pytest.mark.skipif(not shutil.which(nodes.SSHD), reason="sshd not installed")


def llmgw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout)


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def listening(port: int) -> bool:
    return not refuses(port)


def test_layout_names_hardware_and_ports() -> None:
    got = [(n.name, n.hardware, n.port, n.engine_ports_from) for n in labs.layout(4, 3000)]
    assert got == [("gpu-01", "h100-ib", 3000, 21000), ("gpu-02", "l40s-nofabric", 3001, 21100),
                   ("cpu-01", "cpu-only", 3002, 21200), ("gpu-03", "h100-ib", 3003, 21300)]
    with pytest.raises(labs.LabError, match="between 1 and 64"):
        labs.layout(0)


def test_up_serves_a_model_and_down_leaves_nothing_running(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    up = llmgw("lab", "up", "--dir", "lab", "--model", str(model), "--engine", str(STUB_ENGINE),
               cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert "gpu-01" in up.stdout and "cpu-01" in up.stdout and "llmgw plan" in up.stdout
    # The command has exited; the nodes keep running.
    runtime = lab / labs.RUNTIME
    assert all(listening(port) for port in (2201, 2202, 2203))
    assert (lab / ".gitignore").read_text().splitlines() == ["/.llmgw-lab/", "/cluster/state/"]
    assert len((lab / "cluster" / "known_hosts").read_text().splitlines()) == 3
    assert str(tmp_path) not in "".join(p.read_text() for p in (lab / "cluster").iterdir())

    cluster = loading.load(lab / "cluster")
    fleet = asyncio.run(pools.collect(cluster, lab / "cluster"))
    assert {n: r.reachable for n, r in fleet.nodes.items()} == {
        "gpu-01": True, "gpu-02": True, "cpu-01": True}, fleet.nodes
    assert len(fleet.nodes["gpu-01"].gpus) == 8

    apply = subprocess.run([sys.executable, "-m", "llmgw", "apply", "--auto-approve"],
                           cwd=lab, text=True, capture_output=True, timeout=120)
    assert apply.returncode == 0, apply.stdout + apply.stderr
    engines = [p for p in processes.marked(runtime) if b"testengine" in
               Path(f"/proc/{p}/cmdline").read_bytes()]
    assert engines and listening(21200)

    # A second `up` starts nothing and rewrites nothing.
    nodes_yaml = lab / "cluster" / "nodes.yaml"
    nodes_yaml.write_text("# edited by hand\n" + nodes_yaml.read_text())
    again = llmgw("lab", "up", "--dir", "lab", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already running") == 3
    assert nodes_yaml.read_text().startswith("# edited by hand\n")
    assert llmgw("lab", "status", "--dir", "lab", cwd=tmp_path).returncode == 0

    started = processes.marked(runtime)
    assert len(started) >= 7  # 3 sshd, 3 agents, the engine
    down = llmgw("lab", "down", "--dir", "lab", cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    assert "nothing of it is running" in down.stdout
    assert processes.marked(runtime) == []
    assert not any(processes.alive(pid) for pid in started)
    assert all(refuses(port) for port in (2201, 2202, 2203, 21200))
    status = llmgw("lab", "status", "--dir", "lab", cwd=tmp_path)
    assert status.returncode == 3 and status.stdout.count("stopped") == 3

    # Up again: the same nodes, host keys and ports, so the pinned keys still hold.
    assert llmgw("lab", "up", "--dir", "lab", cwd=tmp_path).returncode == 0
    fleet = asyncio.run(pools.collect(cluster, lab / "cluster"))
    assert all(r.reachable for r in fleet.nodes.values()), fleet.nodes
    assert llmgw("lab", "down", "--dir", "lab", "--purge", cwd=tmp_path).returncode == 0
    assert not runtime.exists() and (lab / "cluster" / "cluster.yaml").exists()
    assert processes.marked(runtime) == []


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 2202))
        taken.listen(1)
        result = llmgw("lab", "up", "--nodes", "2", cwd=tmp_path)
    assert result.returncode == 1
    assert "127.0.0.1:2202 (ssh of gpu-02) is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert processes.marked(tmp_path / labs.RUNTIME) == []
    assert refuses(2201)


def test_down_without_a_lab_says_so(tmp_path: Path) -> None:
    result = llmgw("lab", "down", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == f"error: no lab in . (no {labs.RUNTIME}/ there)\n"
    assert not os.listdir(tmp_path)


@pytest.mark.timeout(1500)
def test_up_with_an_account_enrols_bare_nodes_by_node_add() -> None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("node add makes a system account: needs root and useradd")
    try:
        enrolments.build_wheels(WHEELS)
    except enrolments.EnrolError as exc:
        pytest.skip(f"cannot build the wheels node add ships (no package index?): {exc}")
    account = f"llmgw-t{secrets.token_hex(4)}"
    had_group = subprocess.run(["getent", "group", "llmgw"], capture_output=True).returncode == 0
    # Not under pytest's 0700 tmp_path: the account reaches its agent's socket through it.
    where = Path(tempfile.mkdtemp(prefix="llmgw-lab-"))
    where.chmod(0o755)
    lab = where / "lab"
    try:
        up = llmgw("lab", "up", "--dir", "lab", "--nodes", "1", "--ssh-port", "2291",
                   "--account", account, cwd=where, timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "gpu-01: llmgw node add root@127.0.0.1:2291 --name gpu-01" in up.stdout
        assert "    account    " + account + ": " in up.stdout, up.stdout
        assert "    agent      started (supervise backend" in up.stdout, up.stdout
        assert "(node add pins 1 host key)." in up.stdout
        nodes_yaml = (lab / "cluster" / "nodes.yaml").read_text()
        assert "opt/run/agent.sock" in nodes_yaml and "engine_ports_from: 21000" in nodes_yaml
        cluster = loading.load(lab / "cluster")
        assert cluster.cluster.ssh.user == account
        fleet = asyncio.run(pools.collect(cluster, lab / "cluster"))
        assert fleet.nodes["gpu-01"].reachable, fleet.nodes["gpu-01"].error
        assert len(fleet.nodes["gpu-01"].gpus) == 8  # the fixture's hardware, kept by node add
        assert llmgw("lab", "status", "--dir", "lab", cwd=where).returncode == 0

        # Down, then up again: node add's re-run starts the agent again.
        assert llmgw("lab", "down", "--dir", "lab", cwd=where).returncode == 0
        assert processes.marked(lab / labs.RUNTIME) == []
        again = llmgw("lab", "up", "--dir", "lab", cwd=where, timeout=900)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "    install    llmgw" in again.stdout and "already in" in again.stdout
        fleet = asyncio.run(pools.collect(cluster, lab / "cluster"))
        assert fleet.nodes["gpu-01"].reachable, fleet.nodes["gpu-01"].error
        down = llmgw("lab", "down", "--dir", "lab", "--purge", cwd=where)
        assert down.returncode == 0 and f"userdel -r {account}" in down.stdout, down.stdout
        assert processes.marked(lab / labs.RUNTIME) == []
    finally:
        left = processes.marked(lab / labs.RUNTIME)
        processes.terminate(left)
        shutil.rmtree(where, ignore_errors=True)
        simenrolments.remove_account(account, group=not had_group)
