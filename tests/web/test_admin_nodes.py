"""/admin/nodes and a node's page in a real browser, over a real fleet of simulated nodes.

Three simulated nodes (real sshd + agent each): node-01 has the ``faulty`` fixture's
8× H100 (GPU 3 with uncorrected ECC errors, GPU 6 with memory held by a process
llmgw did not start), node-02 is CPU only and runs a stand-in engine placed by a
real ``llmgw serve``, and node-03's agent is stopped, so that nothing of it is
known. The table's GPU column must be what ``llmgw inventory`` prints (one summary
function), and what a node did not report must read as unknown, never as zero.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import nodes
from support.engines import MODELS, STUBS, kill_all, recording
from support.pages import Server, login, shot
from support.plugin import SimClusterFactory

UNKNOWN = ".unknown[title='not reported']"


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("PATH", f"{STUBS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TESTENGINE_RECORD_DIR", str(records))
    yield records
    kill_all(records)


@pytest.fixture
def fleet_server(sim_cluster: SimClusterFactory, engines: Path,
                 tmp_path: Path) -> Iterator[tuple[Server, nodes.SimCluster]]:
    sim: nodes.SimCluster = sim_cluster(3, hardware=("faulty", "cpu-only", "cpu-only"))
    server = Server(sim.cluster_dir, tmp_path / "state", tmp_path / "serve.log")
    models = recording({"tiny": MODELS["tiny"]})
    declared = sim.cluster_data()["nodes"]
    declared["node-03"]["cordoned"] = True  # the agent the test stops runs no engine
    directory = sim.write_cluster({"models": models, "projects": {"research": {}},
                                   "nodes": declared})
    text = (directory / "cluster.yaml").read_text()
    extra = ("  sync: auto\n  drift_interval: 2s\n"
             f"  store: {{path: {tmp_path / 'state' / 'llmgw.db'}}}\n  listeners:\n"
             + "".join(f"    {k}: {v}\n" for k, v in server.listeners().items()))
    (directory / "cluster.yaml").write_text(text.replace("cluster:\n", "cluster:\n" + extra, 1))
    server.user("ada", "--admin")
    server.user("bob", "--project", "research")
    server.start()
    try:
        yield server, sim
    finally:
        server.stop()


def ready(status: dict[str, Any]) -> bool:
    up = [r for r in status["replicas"] if r["model"] == "tiny" and r["state"] == "ready"]
    return bool(up) and not (status["plan"] or {}).get("has_changes", True)


def lost(status: dict[str, Any]) -> bool:
    return status["nodes"].get("node-03", {}).get("reachable") is False


def inventory_gpus(printed: str) -> dict[str, str]:
    """NODE → GPUS column of ``llmgw inventory``'s node table."""
    lines = printed.splitlines()
    head = next(line for line in lines if line.startswith("NODE "))
    start, end = head.index("GPUS"), head.index("CPUS")
    table = lines[lines.index(head) + 1:]
    table = table[:table.index("")]
    return {line.split()[0]: line[start:end].strip() for line in table}


def test_nodes_and_a_node_page_show_the_fleet_with_unknowns_as_unknown(
    fleet_server: tuple[Server, nodes.SimCluster], browser: Any
) -> None:
    server, sim = fleet_server
    [tiny] = [r for r in server.wait(ready, "tiny ready")["replicas"] if r["model"] == "tiny"]
    # node-03 stays reachable over SSH, but no agent answers there any more.
    sim.nodes["node-03"].stop_agent()
    server.wait(lost, "node-03 unreachable")
    printed = inventory_gpus(server.llmgw("inventory").stdout)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    login(page, server.url, "ada")
    page.click("a[href='/admin/nodes']")
    page.wait_for_url(lambda url: url.endswith("/admin/nodes"))
    rows = page.locator("#nodes tbody tr")
    assert [rows.nth(i).get_attribute("data-node") for i in range(rows.count())] == [
        "node-01", "node-02", "node-03"]

    def cells(node: str) -> list[str]:
        return [str(t).strip() for t in
                page.locator(f"tr[data-node='{node}'] > *").all_text_contents()]

    one, two, three = cells("node-01"), cells("node-02"), cells("node-03")
    assert one[1] == "up" and one[3] == printed["node-01"] == "8× h100-80g"
    assert one[4] == "2"  # GPU 3 (ECC) and GPU 6 (foreign memory)
    assert one[5] == "18.0 GiB / 637.2 GiB"  # 7×1 + 18436 MiB of 8×81559 MiB
    assert one[8] == "ib-a"  # 3 of its 4 adapters are ACTIVE: still advertised
    assert two[3] == printed["node-02"] == "cpu only"
    assert cells(tiny["node"])[9] == "1"
    # Of node-03 only its last report's age is known (and that it ran no unit then):
    # the rest reads as unknown, never 0.
    assert three[1].startswith("unreachable agent not running: ") and "(cordoned)" in three[1]
    assert "start the agent there" not in three[1]  # the first clause; the rest on its page
    unknown = page.locator(f"tr[data-node='node-03'] {UNKNOWN}")
    assert unknown.count() == 7, three  # GPUs, faulty, GPU memory, CPUs, memory ×2, agent
    assert (three[3], three[4], three[6], three[10]) == ("—", "—", "—", "—")
    assert three[11].endswith(" ago") and three[9] == "0"
    assert page.locator(f"tr[data-node='node-01'] {UNKNOWN}").count() == 0
    shot(page, "admin-nodes.png")

    # The faulty node's page: its GPUs, faults worded as status words them, fabric state.
    page.click("a[href='/admin/nodes/node-01']")
    page.wait_for_url(lambda url: url.endswith("/admin/nodes/node-01"))
    gpus = page.locator("#gpus tbody tr")
    assert gpus.count() == 8
    ecc = str(page.text_content("tr[data-gpu='3']"))
    assert "faulty" in ecc and "GPU 3 has uncorrected ECC errors" in ecc
    foreign = str(page.text_content("tr[data-gpu='6']"))
    assert "18.0 GiB / 79.6 GiB" in foreign and "37 %" in foreign
    assert "GPU 6 has memory held by pid 48213 (/opt/conda/bin/python3)" in foreign
    healthy = page.locator("tr[data-gpu='0'] > *").all_text_contents()
    assert healthy[4:9] == ["0 %", "Disabled", "0", "—", "free"], healthy
    # The NVLink topology of this node is unknown (no NVML): not "none".
    assert page.get_attribute(f"tr[data-gpu='0'] td:nth-of-type(7) {UNKNOWN}", "title")
    fabric = str(page.text_content("tr[data-fabric='ib-a']"))
    assert "advertised" in fabric and "3 of 4 adapters ACTIVE" in fabric
    assert page.locator("#adapters tbody tr").count() == 4
    assert "INIT" in str(page.text_content("#adapters"))
    assert page.locator("#disks tbody tr").count() >= 1
    # The node and its GPUs (below them, paths of the test machine's fixture files).
    box = page.locator("#gpus-title").locator("..").bounding_box()
    assert box is not None
    shot(page, "admin-node.png", clip={"x": 0, "y": 0, "width": 1280,
                                       "height": box["y"] + box["height"] + 16})

    # The node running the unit lists it; the unreachable one says so and knows nothing.
    page.goto(f"{server.url}/admin/nodes/{tiny['node']}")
    assert tiny["unit"] in str(page.text_content("#units"))
    assert "ready" in str(page.text_content("#units"))
    assert page.locator("#weights tbody tr").count() >= 1
    page.goto(f"{server.url}/admin/nodes/node-03")
    assert "start the agent there" in str(page.text_content("#facts"))
    assert page.locator(f"#facts {UNKNOWN}").count() >= 5

    # On a phone the wide tables scroll inside their wrapper, not the page.
    page.set_viewport_size({"width": 390, "height": 844})
    for path in ("/admin/nodes", "/admin/nodes/node-01"):
        page.goto(f"{server.url}{path}")
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"{path} is {wide} px wide at 390 px"
    page.set_viewport_size({"width": 1280, "height": 900})

    # Unknown or malformed node names: a 404 page, nothing of the name reflected raw.
    for path, text in (("node-99", "no node named node-99"),
                       ("%3Cscript%3Ealert(1)%3C%2Fscript%3E", "not a node name")):
        answer = page.goto(f"{server.url}/admin/nodes/{path}")
        assert answer is not None and answer.status == 404
        assert text in str(page.text_content("main"))
        assert "<script>" not in answer.text()
    page.close()

    # Not for users who are not admins, nor for anyone without a session.
    other = browser.new_page()
    login(other, server.url, "bob")
    for path in ("/admin/nodes", "/admin/nodes/node-01"):
        answer = other.goto(f"{server.url}{path}")
        assert answer is not None and answer.status == 403
        assert "node-01" not in answer.text().replace(path, "")
    other.close()
    anonymous = httpx.get(f"{server.url}/admin/nodes/node-01", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/login")
