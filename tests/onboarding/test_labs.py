"""``llmgw lab``: nodes outlive the command, the cluster reaches them, down leaves nothing."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import daemons, nodes

from llmgw.onboarding import enrolments, labfiles, labs, processes, simenrolments
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
    assert [n.engine_ports_from for n in labs.layout(2, 3000, 15000)] == [15000, 15100]
    with pytest.raises(labs.LabError, match="between 1 and 64"):
        labs.layout(0)


def free_ports(count: int) -> list[int]:
    """Ports for a lab of this test: free now, below the kernel's ephemeral range."""
    first = nodes.free_ports(count)
    return list(range(first, first + count))


def test_up_serves_a_model_and_down_leaves_nothing_running(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    ssh = free_ports(3)
    engine_port = nodes.free_ports(300) + 200  # cpu-01 is the third node
    up = llmgw("lab", "up", "--dir", "lab", "--no-enrol", "--model", str(model),
               "--engine", str(STUB_ENGINE), "--ssh-port", str(ssh[0]),
               "--engine-ports", str(engine_port - 200), cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert "gpu-01" in up.stdout and "cpu-01" in up.stdout and "llmgw plan" in up.stdout
    # The command has exited; the nodes keep running.
    runtime = lab / labs.RUNTIME
    assert all(listening(port) for port in ssh)
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
    assert engines and listening(engine_port)

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
    assert all(refuses(port) for port in (*ssh, engine_port))
    status = llmgw("lab", "status", "--dir", "lab", cwd=tmp_path)
    assert status.returncode == 3 and status.stdout.count("stopped") == 3

    # Up again: the same nodes, host keys and ports, so the pinned keys still hold.
    assert llmgw("lab", "up", "--dir", "lab", cwd=tmp_path).returncode == 0
    fleet = asyncio.run(pools.collect(cluster, lab / "cluster"))
    assert all(r.reachable for r in fleet.nodes.values()), fleet.nodes
    assert llmgw("lab", "down", "--dir", "lab", "--purge", cwd=tmp_path).returncode == 0
    assert not runtime.exists() and (lab / "cluster" / "cluster.yaml").exists()
    assert processes.marked(runtime) == []


def test_a_port_given_that_is_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    first, second = free_ports(2)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", second))
        taken.listen(1)
        result = llmgw("lab", "up", "--no-enrol", "--nodes", "2", "--ssh-port", str(first),
                       cwd=tmp_path)
    assert result.returncode == 1
    assert f"127.0.0.1:{second} (ssh of gpu-02) is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert processes.marked(tmp_path / labs.RUNTIME) == []
    assert refuses(first)


DEFAULTS = [labs.SSH_PORT_FROM + i for i in range(3)] + [
    labs.ENGINE_PORTS_FROM + 100 * i for i in range(3)] + [p for _n, p in labfiles.LISTENERS]


@pytest.fixture
def defaults_held() -> Iterator[list[int]]:
    """Another program on the lab's default ports: listening sockets held for the test.

    A port some other program holds already is just as taken: it is left to it.
    """
    held = []
    for port in DEFAULTS:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.listen(1)
        held.append(sock)
    try:
        yield DEFAULTS
    finally:
        for sock in held:
            sock.close()


def test_up_with_the_default_ports_held_takes_free_ones(
    tmp_path: Path, defaults_held: list[int]
) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    try:
        up = llmgw("lab", "up", "--no-enrol", "--model", str(model), "--engine",
                   str(STUB_ENGINE), cwd=tmp_path)
        assert up.returncode == 0, up.stderr
        assert f"SSH ports {labs.SSH_PORT_FROM}-{labs.SSH_PORT_FROM + 2} are in use" in up.stdout
        assert f"engine ports from {labs.ENGINE_PORTS_FROM} are in use" in up.stdout
        assert "127.0.0.1:8000 (cluster.listeners.router) is in use" in up.stdout
        cluster = loading.load(tmp_path / "cluster")
        used = [n.ssh_port for n in cluster.nodes.values()]
        used += [n.engine_ports_from for n in cluster.nodes.values()]
        used += [int(getattr(cluster.cluster.listeners, name).rsplit(":", 1)[1])
                 for name, _port in labfiles.LISTENERS]
        assert not set(used) & set(defaults_held), used

        # The lab works on the ports it took: every node answers, an engine serves.
        fleet = asyncio.run(pools.collect(cluster, tmp_path / "cluster"))
        assert all(r.reachable for r in fleet.nodes.values()), fleet.nodes
        apply = subprocess.run([sys.executable, "-m", "llmgw", "apply", "--auto-approve"],
                               cwd=tmp_path, text=True, capture_output=True, timeout=120)
        assert apply.returncode == 0, apply.stdout + apply.stderr
        port = cluster.nodes["cpu-01"].engine_ports_from
        reply = wait_for_models(port)
        assert [m["id"] for m in reply["data"]] == ["gemma3-270m"]
        doctor = llmgw("doctor", "--json", cwd=tmp_path)
        checks = {f["check"]: f["status"] for fs in json.loads(doctor.stdout)["nodes"].values()
                  for f in fs}
        assert checks["engine-ports"] == "ok", doctor.stdout

        # And a request through the daemon's router, on the listener the lab chose.
        key = llmgw("keys", "create", "--project", "research", cwd=tmp_path)
        assert key.returncode == 0, key.stderr
        listen = {name: int(getattr(cluster.cluster.listeners, name).rsplit(":", 1)[1])
                  for name in daemons.LISTENERS}
        served = daemons.Daemon(tmp_path / "cluster", tmp_path / "serve.log", ports=listen,
                                token=tmp_path / labs.RUNTIME / "admin.token")
        served.start()
        try:
            reply = served.until(lambda: completed(served.router, key.stdout.split()[0]),
                                 "an answer through the router")
            assert reply["model"] == "gemma3-270m"
        finally:
            served.stop()
    finally:
        llmgw("lab", "down", "--purge", cwd=tmp_path)
    assert processes.marked(tmp_path / labs.RUNTIME) == []


def completed(router: str, key: str) -> dict[str, Any] | None:
    reply = httpx.post(f"{router}/v1/completions", timeout=10,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": "gemma3-270m", "prompt": "hi", "max_tokens": 2})
    return reply.json() if reply.status_code == 200 else None  # type: ignore[no-any-return]


def wait_for_models(port: int, timeout: float = 30) -> dict[str, Any]:
    """``GET /v1/models`` of the engine on ``port``, once it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            if reply.status_code == 200:
                return reply.json()  # type: ignore[no-any-return]
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"no engine answered on {port}"
        time.sleep(0.05)


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
        # Engine ports given too: the default 21000 may be in use on this machine.
        port, engines = free_ports(101)[:2]
        up = llmgw("lab", "up", "--dir", "lab", "--nodes", "1", "--ssh-port", str(port),
                   "--engine-ports", str(engines), "--account", account, cwd=where,
                   timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"gpu-01: llmgw node add root@127.0.0.1:{port} --name gpu-01" in up.stdout
        assert "    account    " + account + ": " in up.stdout, up.stdout
        assert "    agent      started (supervise backend" in up.stdout, up.stdout
        assert "(node add pins 1 host key)." in up.stdout
        nodes_yaml = (lab / "cluster" / "nodes.yaml").read_text()
        assert "opt/run/agent.sock" in nodes_yaml and f"engine_ports_from: {engines}" in nodes_yaml
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
