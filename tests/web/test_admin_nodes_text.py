"""A node's free text on /admin/nodes/<node>: scrubbed of secrets, then escaped.

What nodes report (process names on a GPU, units' details and log tails, warnings)
is text nobody at llmgw wrote. A router with the pages (:class:`support.stacks.Stack`)
on a loopback port is given a fleet with hostile text, and the admin's pages are
fetched over real HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.stacks import Stack, cluster

from llmgw.fleet.types import Fleet, Gpu, GpuProcess, NodeReport, Unit
from llmgw.planning import summaries
from llmgw.router import Settings
from llmgw.store import users
from llmgw.web import AdminView

HOSTILE = "<img src=x onerror=alert(1)>"
TOKEN = "hf_" + "A1b2C3d4E5" * 4


def fleet() -> Fleet:
    gpu = Gpu(index=0, uuid="GPU-0", name=f"NVIDIA {HOSTILE}", gpu_class="h100-80g",
              processes=[GpuProcess(pid=7, name=f"python3 {HOSTILE} --token {TOKEN}")])
    unit = Unit(name="llmgw-chat-r0-s0.service", model="chat", replica=0, digest="d",
                state="failed", detail=f"exited 1: HF_TOKEN={TOKEN} {HOSTILE}")
    return Fleet(nodes={"gpu-01": NodeReport(
        node="gpu-01", gpus=[gpu], units=[unit], warnings=[f"<script>alert(2)</script>{TOKEN}"]),
        "gpu-02": NodeReport(node="gpu-02", reachable=False, error=f"refused {TOKEN}; {HOSTILE}")})


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    made = Stack(tmp_path, cluster(), Settings(), 0, pages=True)
    made.run(users.create(made.db, "ada", "ada-admin-pass", admin=True))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def client(stack: Stack) -> Iterator[httpx.Client]:
    """The admin's session."""
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        login(client)
        yield client


def login(client: httpx.Client) -> None:
    form = client.get("/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token
    answer = client.post("/login", data={"name": "ada", "password": "ada-admin-pass",
                                         "csrf": token.group(1)})
    assert answer.status_code == 303


@pytest.mark.parametrize("path", ["/admin/nodes", "/admin/nodes/gpu-01", "/admin/nodes/gpu-02"])
def test_reported_text_is_scrubbed_and_escaped(stack: Stack, client: httpx.Client,
                                               path: str) -> None:
    observed = fleet()
    spec = stack.pages.cluster()
    stack.pages.admin = lambda: AdminView(
        summary=summaries.summarize(spec, observed, 0.0), fleet=observed)
    page = client.get(path)
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert TOKEN not in page.text
    assert "<img" not in page.text and "<script>alert" not in page.text
    if path != "/admin/nodes":
        assert "&lt;img src=x onerror=alert(1)&gt;" in page.text


def test_before_the_first_observation_there_is_nothing_to_show(client: httpx.Client) -> None:
    assert "has not observed the fleet yet" in client.get("/admin/nodes").text
    answer = client.get("/admin/nodes/gpu-01")
    assert answer.status_code == 503 and "has not observed the fleet yet" in answer.text


@pytest.mark.parametrize(("target", "goes_to"), [
    ("/admin/nodes", "/admin/nodes"),
    ("/admin/nodes/gpu-01", "/admin/nodes/gpu-01"),
    ("/admin/nodes/GPU-01", "/admin"),  # not a node name
    ("/admin/nodes/gpu-01/x", "/admin"),
    ("/admin/nodes/", "/admin"),
])
def test_a_login_goes_back_to_the_node_page_it_came_from(
    stack: Stack, target: str, goes_to: str
) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        if goes_to == target:  # a page: it sends the anonymous to the login, and back
            sent = client.get(target)
            assert sent.status_code == 303
            assert sent.headers["location"] == f"/login?next={target}"
        form = client.get("/login", params={"next": target}).text
        token = re.search(r'name="csrf" value="([^"]+)"', form)
        assert token
        answer = client.post("/login", data={"name": "ada", "password": "ada-admin-pass",
                                             "csrf": token.group(1), "next": target})
    assert answer.status_code == 303 and answer.headers["location"] == goes_to


def test_what_each_fabric_holds_is_shown_once_and_escaped(tmp_path: Path) -> None:
    """The weights section: a shared store once for its fabric, whatever its agents
    report (sources and paths are free text from nodes: escaped, and scrubbed)."""
    from llmgw.fleet.types import CachedWeights, Disk, Mount
    from llmgw.spec.models import Cluster

    spec = Cluster.model_validate({
        "cluster": {"name": "lab"}, "fabrics": {"ib-a": {"kind": "infiniband"}},
        "nodes": {n: {"address": f"10.0.0.{i}", "fabrics": {"ib-a": ["mlx5_0"]},
                      "weights_dirs": ["/models"]} for i, n in enumerate(["gpu-01", "gpu-02"])},
        "models": {"chat": {"source": "org/chat", "profiles": [
            {"engine": "vllm", "gpu_class": "h100-80g"}]}}})
    mount = Mount(mount_point="/models", fs_type="nfs4", shared=True,
                  source=f"filer{HOSTILE}:/export/{TOKEN}")
    cached = [CachedWeights(source="org/chat", path="/models/hub/models--org--chat/snapshots/1",
                            size_bytes=2 * 1024**3)]
    observed = Fleet(nodes={n: NodeReport(node=n, disks=[Disk(path="/models", mount=mount)],
                                          cached_weights=cached) for n in ("gpu-01", "gpu-02")})
    made = Stack(tmp_path, spec, Settings(), 0, pages=True)
    try:
        made.run(users.create(made.db, "ada", "ada-admin-pass", admin=True))
        made.pages.admin = lambda: AdminView(
            summary=summaries.summarize(spec, observed, 0.0), fleet=observed)
        with httpx.Client(base_url=made.url, timeout=30) as client:
            login(client)
            page = client.get("/admin/nodes").text
    finally:
        made.close()
    section = page[page.index('id="weights"'):]
    rows = re.findall(r"<tr data-fabric=\"ib-a\">(.*?)</tr>", section)
    assert len(rows) == 1, rows  # one copy on one store, though two agents report it
    assert "gpu-01, gpu-02" in rows[0] and ">chat<" in rows[0] and "2.0 GiB" in rows[0]
    assert "&lt;img src=x onerror=alert(1)&gt;" in rows[0] and "<img" not in page
    assert TOKEN not in page
