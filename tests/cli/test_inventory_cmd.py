"""``llmgw inventory`` and ``llmgw status`` as an operator runs them, against simulated nodes."""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

import pytest
from support.plugin import SimClusterFactory

from llmgw.cli import inventory_cmd
from llmgw.cli.main import main
from llmgw.fleet.types import Fleet, NodeReport, Unit


def llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args],
                          capture_output=True, text=True, timeout=120)


def test_inventory_text_json_and_snapshot_file(
    sim_cluster: SimClusterFactory, tmp_path: Path
) -> None:
    sim = sim_cluster(3, hardware=["h100-ib", "faulty", "cpu-only"])
    cluster_dir = sim.write_cluster()
    sim.nodes["node-03"].stop_sshd()

    text = llmgw("inventory", "--cluster", str(cluster_dir))
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert out.startswith("Cluster sim: 3 nodes, 2 reachable, 1 unreachable\n")
    assert "GPUs by class" in out and "h100-80g" in out
    assert "GPU faults" in out and "uncorrected ECC" in out
    assert "ib-a (infiniband): advertised by node-01 (4 adapters)" in out
    where = f"{getpass.getuser()}@[127.0.0.1]:{sim.nodes['node-03'].port}"
    assert f"  node-03: refused: {where} refused the connection" in out

    snapshot = tmp_path / "fleet.json"
    js = llmgw("inventory", "--cluster", str(cluster_dir), "--json", "--out", str(snapshot))
    assert js.returncode == 0, js.stderr
    fleet = Fleet.model_validate_json(js.stdout)
    assert fleet == Fleet.model_validate_json(snapshot.read_text())
    assert sorted(fleet.nodes) == ["node-01", "node-02", "node-03"]
    assert len(fleet.nodes["node-01"].gpus) == 8
    assert not fleet.nodes["node-03"].reachable

    # The snapshot is what `llmgw plan --observed` reads.
    plan = llmgw("plan", "--cluster", str(cluster_dir), "--observed", str(snapshot),
                 "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr

    status = llmgw("status", "--cluster", str(cluster_dir))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "sim: 3 nodes (1 unreachable), 0 replicas"
    assert any(line.split()[:2] == ["node-03", "DOWN"] for line in lines)


def test_bad_input_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    missing = llmgw("inventory", "--cluster", str(tmp_path / "nope"))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "nope" in missing.stderr

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "cluster.yaml").write_text("cluster:\n  name: x\n  sssh: {}\n")
    bad = llmgw("status", "--cluster", str(broken))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "cluster.yaml:3:3" in bad.stderr

    (broken / "cluster.yaml").write_text("cluster:\n  name: x\n")
    timeout = llmgw("inventory", "--cluster", str(broken), "--timeout", "0")
    assert timeout.returncode == 1
    assert timeout.stderr == "error: --timeout must be positive; got 0\n"


HF = "hf_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456"


def test_inventory_prints_and_saves_no_token_a_node_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # Inventories are pasted into tickets: a token in an engine's log line or a node's
    # error must not come out of any of its forms (issue 23).
    (tmp_path / "cluster.yaml").write_text(
        "cluster: {name: c}\nnodes: {cpu-01: {address: 10.0.0.1}}\n")
    unit = Unit(name="llmgw-m-r0-s0.service", model="m", replica=0, digest="d" * 16,
                state="failed", detail=f"exited (token {HF})", log_tail=[f"401: {HF}"])
    fleet = Fleet(nodes={"cpu-01": NodeReport(node="cpu-01", units=[unit]),
                         "cpu-02": NodeReport(node="cpu-02", reachable=False,
                                              error=f"ssh: token={HF} refused")})
    monkeypatch.setattr(inventory_cmd, "collect", lambda *_: fleet)
    snapshot = tmp_path / "fleet.json"
    for flags in ([], ["--json"], ["--out", str(snapshot)]):
        assert main(["inventory", "--cluster", str(tmp_path), *flags]) == 0
        out = capsys.readouterr().out
        assert HF[:12] not in out, flags
        assert "cpu-02" in out
    assert HF[:12] not in snapshot.read_text() and "exited (token" in snapshot.read_text()
