"""SGLang installs, tested as vLLM's are (``test_agent_engine_installs.py``): a real wheel
from a real local index, the agent's own venv and pip, over the SSH tunnel.

The stand-in ``sglang`` wheel (``tests/support/indexes.py``) holds a package whose
``__version__`` is its version: what the agent's check runs (``bin/python -c "import
sglang; print(sglang.__version__)"``, as SGLang's install guide verifies an install). Also
``llmgw engine install sglang==…`` from the command line, and the C compiler the vLLM and
SGLang environments need for Triton.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import indexes
from support.indexes import Index
from support.plugin import SimClusterFactory

from llmgw.agent import installs
from llmgw.agent.settings import EngineSettings
from llmgw.spec import loading
from llmgw.transport import pools
from llmgw.transport.agent_client import EngineProgress

VERSION = "0.5.3"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return indexes.build_standin(tmp_path_factory.mktemp("standin"), "sglang", VERSION)


@pytest.fixture
def index(standin: Path, tmp_path: Path) -> Iterator[Index]:
    with indexes.serving(tmp_path / "index", standin) as served:
        yield served


def requirements(wheel: Path) -> str:
    return f"sglang=={VERSION} \\\n    --hash=sha256:{indexes.sha256(wheel)}\n"


async def install(pool: pools.Pool, node: str, text: str, url: str,
                  version: str = VERSION) -> list[EngineProgress]:
    agent = await pool.client(node)
    return [p async for p in agent.install_engine("sglang", version, requirements=text,
                                                  index_url=url)]


def leftovers(engines: Path) -> list[str]:
    return sorted(p.name for p in engines.iterdir() if p.name != installs.INCOMING)


async def test_sglang_is_installed_into_its_own_venv_and_proved_by_its_import(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    engines = sim.nodes["node-01"].root / "engines"
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        steps = await install(pool, "node-01", requirements(standin), index.url)
        last = steps[-1]
        assert last.fetch.state == "done", last
        assert last.fetch.target == f"sglang {VERSION}"
        assert last.path == str(engines / f"sglang-{VERSION}")
        # The progress stream carries the latest state, so a quick step such as "checking
        # that it runs" may never be seen; the next test proves the import check runs.
        facts = (await pool.report("node-01")).host
        assert facts is not None
        assert [(e.engine, e.version, e.program) for e in facts.installed_engines] == [
            ("sglang", VERSION, "bin/python")]
    assert leftovers(engines) == [f"sglang-{VERSION}"]
    venv = engines / f"sglang-{VERSION}"
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    ran = subprocess.run([venv / "bin" / "python", "-c", installs.CHECKS["sglang"][2]],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == VERSION
    assert index.downloads(standin.name) == 1


async def test_requirements_that_install_another_sglang_are_refused_and_leave_nothing(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["h100-ib"])
    cluster = loading.load(sim.write_cluster())
    engines = sim.nodes["node-01"].root / "engines"
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        steps = await install(pool, "node-01", requirements(standin), index.url, "0.5.4")
    assert steps[-1].fetch.state == "failed"
    assert steps[-1].fetch.error == (
        f"python -c import sglang; print(sglang.__version__) says '{VERSION}', not 0.5.4: "
        "the requirements install another version")
    assert leftovers(engines) == []


async def test_a_node_without_a_gpu_skips_sglang_without_a_fault(
    sim_cluster: SimClusterFactory, index: Index, standin: Path,
) -> None:
    sim = sim_cluster(1, hardware=["cpu-only"])
    cluster = loading.load(sim.write_cluster())
    async with pools.Pool(cluster, sim.cluster_dir) as pool:
        steps = await install(pool, "node-01", requirements(standin), index.url)
        node = await pool.report("node-01")
    assert steps[-1].fetch.state == "skipped"
    assert steps[-1].fetch.error == "this node has no GPU: sglang is not installed here"
    assert node.fetches == []
    assert index.downloads(standin.name) == 0


def test_the_command_line_installs_sglang_on_gpu_nodes_and_skips_the_others(
    sim_cluster: SimClusterFactory, index: Index, standin: Path, tmp_path: Path,
) -> None:
    sim = sim_cluster(2, hardware=["h100-ib", "cpu-only"])
    directory = sim.write_cluster()
    pinned = tmp_path / f"sglang-{VERSION}.txt"
    pinned.write_text(requirements(standin))
    command = [sys.executable, "-m", "llmgw", "engine", "install", f"sglang=={VERSION}",
               "--requirements", str(pinned), "--index-url", index.url, "--cluster",
               str(directory)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert f"node-01  installed sglang {VERSION} in " \
           f"{sim.nodes['node-01'].root / 'engines' / f'sglang-{VERSION}'}" in lines, lines
    assert "node-02  skipped: this node has no GPU: sglang is not installed here" in lines
    assert lines[-1] == f"sglang {VERSION}: 1 installed, 0 already there, 1 skipped, 0 failed."
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.stdout.splitlines()[-1] == (
        f"sglang {VERSION}: 0 installed, 1 already there, 1 skipped, 0 failed.")
    assert index.downloads(standin.name) == 1


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_a_node_without_a_c_compiler_fails_the_install_with_the_fix(
    engine: str, tmp_path: Path, index: Index,
) -> None:
    started: list[object] = []

    async def start(changes: object) -> list[installs.UnitResult]:
        started.append(changes)
        return []

    async def has_gpu() -> bool:
        return True

    installer = installs.Installer(EngineSettings(dir=str(tmp_path / "engines")), start,
                                   has_gpu, lambda: None, compiler=lambda: "")
    wanted = installs.request(engine, VERSION, requirements=f"{engine}=={VERSION} "
                              f"--hash=sha256:{'a' * 64}\n", index_url=index.url)
    progress = installer.start(wanted)
    await asyncio.wait_for(installer._tasks[wanted.key], 30)
    assert (progress.state, progress.error) == ("failed", installs.no_compiler(engine))
    assert "apt-get install gcc" in progress.error
    assert "run `llmgw node add` for this node again, which installs gcc" in progress.error
    assert [f.error for f in installer.reports()] == [progress.error], "reported as a fault"
    assert not (tmp_path / "engines").exists(), "nothing fetched, nothing made"
    assert index.log.read_text().count("GET /files/") == 0
