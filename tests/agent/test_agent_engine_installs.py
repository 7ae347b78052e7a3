"""vLLM-style engine installs on simulated nodes, from a local package index.

A real wheel (``tests/support/indexes.py``: a small pure-Python ``vllm``
whose ``vllm --version`` prints its version) is served by a PEP 503 index
(``python -m http.server``); the agent behind a real sshd installs it into
``<engines dir>/vllm-0.11.0`` with ``pip install --require-hashes --no-deps``
in a fresh venv, driven through ``InstallEngine`` over the SSH tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import agent_support
import pytest
from support import indexes
from support.indexes import Index
from support.plugin import SimClusterFactory

from llmgw.agent import installs
from llmgw.fleet.types import NodeReport
from llmgw.spec import loading
from llmgw.transport import pools
from llmgw.transport.agent_client import AgentClient, EngineProgress, UnitChange

VERSION = "0.11.0"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return indexes.build_standin(tmp_path_factory.mktemp("standin"), "vllm", VERSION)


@pytest.fixture
def index(standin: Path, tmp_path: Path) -> Iterator[Index]:
    with indexes.serving(tmp_path / "index", standin) as served:
        yield served


def requirements(wheel: Path, digest: str | None = None) -> str:
    """What ``pip-compile --generate-hashes`` writes for the one package."""
    return (f"vllm=={VERSION} \\\n    --hash=sha256:{digest or indexes.sha256(wheel)}\n"
            "    # via -r requirements.in\n")


async def install(pool: pools.Pool, node: str, text: str, url: str) -> list[EngineProgress]:
    agent = await pool.client(node)
    return [p async for p in agent.install_engine("vllm", VERSION, requirements=text,
                                                  index_url=url)]


async def report(pool: pools.Pool, node: str) -> NodeReport:
    return await pool.call(node, lambda agent: agent.report())


def leftovers(engines: Path) -> list[str]:
    return sorted(p.name for p in engines.iterdir() if p.name != installs.INCOMING)


async def test_vllm_is_installed_into_its_own_venv_from_the_index(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    engines = sim.nodes["node-01"].root / "engines"
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        steps = await install(pool, "node-01", requirements(standin), index.url)
        last = steps[-1]
        assert last.fetch.state == "done", last
        assert last.fetch.kind == "engine" and last.fetch.target == f"vllm {VERSION}"
        assert last.path == str(engines / f"vllm-{VERSION}")
        # Progress was shown on the way: the download with its bytes.
        assert any(p.step.startswith("downloading wheels") for p in steps)
        assert max(p.fetch.bytes_done for p in steps) > 0
        facts = (await report(pool, "node-01")).host
        assert facts is not None and facts.engines_dir == str(engines)
        assert [(e.engine, e.version, e.path) for e in facts.installed_engines] == [
            ("vllm", VERSION, str(engines / f"vllm-{VERSION}"))]
    assert leftovers(engines) == [f"vllm-{VERSION}"]
    venv = engines / f"vllm-{VERSION}"
    # A venv of its own, not the system's site-packages; its script runs after the move.
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    ran = subprocess.run([venv / "bin" / "vllm", "--version"], capture_output=True, text=True,
                         check=True)
    assert ran.stdout.strip() == VERSION


async def test_a_wrong_hash_fails_with_the_reason_and_leaves_nothing(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    engines = sim.nodes["node-01"].root / "engines"
    wrong = "0" * 64
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        steps = await install(pool, "node-01", requirements(standin, wrong), index.url)
        last = steps[-1].fetch
        assert last.state == "failed"
        assert last.error == (
            "pip download exited 1: ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE "
            f"REQUIREMENTS FILE. | vllm==0.11.0 from {index.url[:-len('/simple')]}/files/"
            f"{standin.name} | Expected sha256 {wrong} | Got {indexes.sha256(standin)}")
        node = await report(pool, "node-01")
        assert [(f.kind, f.state, f.error) for f in node.fetches] == [
            ("engine", "failed", last.error)]
        assert node.host is not None and node.host.installed_engines == []
    assert leftovers(engines) == [], "no half-installed directory"


async def test_concurrent_requests_share_one_install(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        first, second = await asyncio.gather(
            install(pool, "node-01", requirements(standin), index.url),
            install(pool, "node-01", requirements(standin), index.url))
    assert first[-1].fetch.state == second[-1].fetch.state == "done"
    assert first[-1].fetch.started_at == second[-1].fetch.started_at, "one install, joined"
    assert index.downloads(standin.name) == 1


async def test_an_extra_index_is_searched_too(
    sim_cluster: SimClusterFactory, index: Index, standin: Path, tmp_path: Path,
) -> None:
    empty = Index(tmp_path / "empty")  # the site's own mirror, without this package
    (empty.root / "simple").mkdir(parents=True)
    (empty.root / "simple" / "index.html").write_text("<!DOCTYPE html><html></html>\n")
    empty.start()
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    try:
        async with pools.Pool(cluster, sim.cluster_dir) as pool:
            agent = await pool.client("node-01")
            steps = [p async for p in agent.install_engine(
                "vllm", VERSION, requirements=requirements(standin), index_url=empty.url,
                extra_index_urls=[index.url])]
    finally:
        empty.stop()
    assert steps[-1].fetch.state == "done", steps[-1]
    assert index.downloads(standin.name) == 1


async def test_a_node_without_a_gpu_skips_vllm_without_a_fault(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["cpu-only"])
    cluster = loading.load(sim.write_cluster())
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        steps = await install(pool, "node-01", requirements(standin), index.url)
        node = await report(pool, "node-01")
    assert steps[-1].fetch.state == "skipped"
    assert steps[-1].fetch.error == "this node has no GPU: vllm is not installed here"
    assert node.fetches == [], "a skip is not reported as a fetch: it is no fault"
    assert index.downloads(standin.name) == 0


@pytest.mark.parametrize(
    ("engine", "text", "binary", "message"), [
        pytest.param("vllm", "vllm==0.11.0\n", "", "requirements line 1: 'vllm==0.11.0' is not",
                     id="no-hash"),
        pytest.param("vllm", f"vllm>=0.11 --hash=sha256:{'a' * 64}\n", "", "line 1:",
                     id="not-pinned"),
        pytest.param("vllm", f"--index-url http://evil/\nvllm==0.11.0 --hash=sha256:{'a' * 64}",
                     "", "line 1: '--index-url http://evil/'", id="option-redirects-pip"),
        pytest.param("vllm", "# nothing\n", "", "name no package", id="empty"),
        pytest.param("vllm", "", "/tmp/llama-server", "give requirements", id="binary-for-vllm"),
        pytest.param("llama.cpp", "x==1 --hash=sha256:" + "a" * 64, "", "give binary",
                     id="requirements-for-llama"),
        pytest.param("ollama", "", "x", "is not one of vllm, sglang, llama.cpp", id="engine"),
        pytest.param("vllm", f"vllm==0.11.0 --hash=sha256:{'a' * 64}", "",
                     "index URL 'file:///etc' is not an http(s) URL", id="index-not-http"),
    ])
def test_requests_are_checked_before_anything_runs(
    engine: str, text: str, binary: str, message: str,
) -> None:
    with pytest.raises(installs.InstallError, match=None) as caught:
        installs.request(engine, VERSION, binary=binary, requirements=text,
                         extra_index_urls=["file:///etc"] if "index" in message else [])
    assert message in str(caught.value)


def test_a_version_that_is_not_one_is_refused() -> None:
    with pytest.raises(installs.InstallError, match="is not a version"):
        installs.request("vllm", "../../etc", requirements="x")


async def test_the_grpc_refusal_names_the_problem(sim_cluster: SimClusterFactory) -> None:
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        agent: AgentClient = await pool.client("node-01")
        with pytest.raises(Exception, match="requirements line 1") as caught:
            _ = [p async for p in agent.install_engine("vllm", VERSION,
                                                       requirements="vllm==0.11.0")]
    assert "INVALID_ARGUMENT" in str(caught.value)


async def test_a_binary_that_does_not_run_is_never_moved_into_place(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(1, hardware=["cpu-only"])
    cluster = loading.load(sim.write_cluster())
    engines = sim.nodes["node-01"].root / "engines"
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        shipped = engines / installs.INCOMING / "llama-server"  # where SFTP puts it
        shipped.parent.mkdir(parents=True)
        shipped.write_text("#!/bin/sh\necho 'error while loading shared libraries: libgomp.so.1'"
                           " >&2\nexit 127\n")
        agent = await pool.client("node-01")
        steps = [p async for p in agent.install_engine("llama.cpp", "11434.0.0",
                                                       binary=str(shipped))]
        assert steps[-1].fetch.state == "failed"
        assert steps[-1].fetch.error == (
            "llama-server --version exited 127: "
            "error while loading shared libraries: libgomp.so.1")
        # A binary from anywhere but the incoming directory is refused.
        elsewhere = sim.root / "llama-server"
        elsewhere.write_text("#!/bin/sh\nexit 0\n")
        steps = [p async for p in agent.install_engine("llama.cpp", "11434.0.0",
                                                       binary=str(elsewhere))]
        assert steps[-1].fetch.state == "failed"
        assert "the binary must be under" in steps[-1].fetch.error
    assert leftovers(engines) == []


async def test_an_agent_start_sweeps_what_a_killed_install_left(
    sim_cluster: SimClusterFactory,
) -> None:
    sim = sim_cluster(1, hardware=["cpu-only"])
    node = sim.nodes["node-01"]
    engines = node.root / "engines"
    assert not engines.exists(), "nothing is made before an install needs it"
    node.stop_agent()
    (engines / f".llama.cpp-11434.0.0{installs.PARTIAL}dead" / "bin").mkdir(parents=True)
    (engines / "llama.cpp-11434.0.0" / "bin").mkdir(parents=True)
    sim.start_agent(node)
    cluster = loading.load(sim.write_cluster())
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        facts = (await report(pool, "node-01")).host
    assert leftovers(engines) == ["llama.cpp-11434.0.0"]
    assert facts is not None
    assert [(e.engine, e.version) for e in facts.installed_engines] == [
        ("llama.cpp", "11434.0.0")]


async def test_a_unit_of_a_version_not_installed_waits_and_says_why(
    sim_cluster: SimClusterFactory, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    spec = json.dumps({"v": 1, "engine": "vllm", "engine_version": VERSION},
                      separators=(",", ":"))
    text = agent_support.unit_text().replace('X-Llmgw-Spec={"v":1}', f"X-Llmgw-Spec={spec}")
    change = UnitChange(agent_support.unit_name(), text, "", {}, "start")
    with socket.socket() as hole:  # an index that accepts and never answers: pip waits
        hole.bind(("127.0.0.1", 0))
        hole.listen(4)
        url = f"http://127.0.0.1:{hole.getsockname()[1]}/simple"
        async with pools.Pool(cluster, sim.cluster_dir) as pool:
            [result] = await pool.call("node-01", lambda agent: agent.apply_units([change]))
            assert result.ok, result
            [unit] = (await report(pool, "node-01")).units
            assert (unit.state, unit.detail, unit.pid) == (
                "failed", f"engine vllm {VERSION} is not installed on this node: run "
                f"`llmgw engine install vllm=={VERSION} NODE`", None)
            agent = await pool.client("node-01")
            async with contextlib.aclosing(agent.install_engine(
                    "vllm", VERSION, requirements=requirements(standin),
                    index_url=url)) as progress:
                async for step in progress:
                    if step.step.startswith("downloading wheels"):
                        break
            [unit] = (await report(pool, "node-01")).units
    assert unit.state == "fetching", unit
    assert unit.detail.startswith(f"installing vllm {VERSION}: downloading wheels"), unit
    assert unit.pid is None, "held until its engine is installed"
