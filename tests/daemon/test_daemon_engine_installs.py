"""``engines.vllm.install: auto``: the daemon installs vLLM on every GPU node that passes
the checks, in the background, and says per node why not.

Real parts: simulated nodes behind a real sshd with real agents (fixture hardware), a
real PEP 503 index serving a small built ``vllm`` wheel (``tests/support/indexes.py``),
the agent's real venv and pip. The daemon's loop is driven one iteration at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import indexes
from support.indexes import Index
from support.plugin import SimClusterFactory

from llmgw.cli import inventories
from llmgw.daemon import admin
from llmgw.daemon.reconcilers import Daemon
from llmgw.spec import loading
from llmgw.transport import pools

VERSION = "0.11.0"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return indexes.build_standin(tmp_path_factory.mktemp("standin"), "vllm", VERSION)


@pytest.fixture
def index(standin: Path, tmp_path: Path) -> Iterator[Index]:
    with indexes.serving(tmp_path / "index", standin) as served:
        yield served


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def cluster_dir(sim_cluster: SimClusterFactory, index: Index, digest: str) -> Path:
    sim = sim_cluster(2, hardware=["h100-ib", "cpu-only"])
    directory = sim.write_cluster({"engines": {"vllm": {
        "version": VERSION, "install": "auto", "index_url": index.url}}})
    (directory / "engines").mkdir()
    (directory / "engines" / f"vllm-{VERSION}.txt").write_text(
        f"vllm=={VERSION} --hash=sha256:{digest}\n")
    return directory


def states(daemon: Daemon) -> dict[str, tuple[str, str]]:
    return {i.node: (i.state, i.reason) for i in daemon.state.engine_installs}


async def test_gpu_nodes_get_vllm_and_a_node_without_gpus_is_skipped(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    directory = cluster_dir(sim_cluster, index, indexes.sha256(standin))
    cluster = loading.load(directory)
    async with pools.Pool(cluster, directory) as pool:
        daemon = Daemon(directory, cluster, agents=pool)
        await daemon.reconcile()
        first = states(daemon)
        assert first["node-01"] == ("installing", "starting"), first
        assert first["node-02"] == ("skip", "no GPU: vLLM runs on GPUs only"), first
        await daemon.installs.wait()
        await daemon.reconcile()
        installed = states(daemon)
        assert installed["node-01"][0] == "installed", installed
        assert installed["node-01"][1].endswith(f"/vllm-{VERSION}"), installed
        assert installed["node-02"][0] == "skip"
        # Idempotent: another iteration installs nothing again.
        await daemon.reconcile()
        await daemon.installs.wait()
        assert states(daemon)["node-01"][0] == "installed"
        assert index.downloads(standin.name) == 1
        doc = admin.status(daemon)["engine_installs"]
        assert [(d["node"], d["state"]) for d in doc] == [("node-01", "installed"),
                                                           ("node-02", "skip")]
        assert doc[1]["line"] == f"vllm {VERSION} on node-02: skip: no GPU: vLLM runs on GPUs only"
        assert daemon.state.fleet is not None
        text = inventories.render_engine_installs(cluster, daemon.state.fleet, doc)
        assert text.splitlines()[1:4] == [
            "Engines", f"  vllm {VERSION} (install: auto)",
            f"    node-01  installed: {installed['node-01'][1]}"], text
        await daemon.installs.aclose()


async def test_a_failed_install_is_retried_after_a_backoff_not_at_once(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    directory = cluster_dir(sim_cluster, index, "0" * 64)  # a hash the wheel does not have
    cluster = loading.load(directory)
    clock = Clock()
    async with pools.Pool(cluster, directory) as pool:
        daemon = Daemon(directory, cluster, agents=pool, clock=clock)
        await daemon.reconcile()
        await daemon.installs.wait()
        for _ in range(3):  # iterations in the same minute start nothing
            await daemon.reconcile()
            state, reason = states(daemon)["node-01"]
            assert state == "waiting", reason
            assert "THESE PACKAGES DO NOT MATCH THE HASHES" in reason, reason
        await daemon.installs.wait()
        assert index.downloads(standin.name) == 1
        clock.now += 60  # past the first backoff (30-60 s)
        await daemon.reconcile()
        assert states(daemon)["node-01"][0] == "installing"
        await daemon.installs.wait()
        assert index.downloads(standin.name) == 2
        await daemon.reconcile()
        assert daemon.state.engine_installs[0].failures == 2
        await daemon.installs.aclose()
