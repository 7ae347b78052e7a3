"""``llmgw inventory`` and ``llmgw status`` as an operator runs them, against simulated nodes."""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

from support.plugin import SimClusterFactory

from llmgw.fleet.types import Fleet


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
