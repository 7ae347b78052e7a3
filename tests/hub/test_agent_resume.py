"""A real `llmgw agent serve`, SIGKILLed mid-download: the restarted agent resumes the fetch.

The unit waits as `fetching` (its files written, its process not started),
the report carries the fetch's bytes; after SIGKILL the new agent picks the
waiting unit up from its state directory, asks the server only for the
missing range (counted at the server), and starts the engine with the local
snapshot path.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mirror_support import GEMMA, GEMMA_REPO, gemma_repo, serving

sys.path.insert(0, str(Path(__file__).parents[1] / "agent"))
from agent_support import eventually, free_port, short_dir, unit_text  # noqa: E402
from test_agent_cli import AgentProcess, connected, write_config  # noqa: E402

from llmgw.hub import caches  # noqa: E402
from llmgw.proto.conversions import UnitChange  # noqa: E402

pytestmark = pytest.mark.skipif(not GEMMA.exists(), reason="run `make model` (make test does)")
SOURCE = f"{GEMMA_REPO}:Q4_K_M"
NAME = "llmgw-gemma-r0-s0.service"


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def unit(weights: Path, endpoint: str, port: int) -> str:
    """The rendered shape of a unit whose spec names a repo the agent must fetch."""
    spec = {"v": 1, "weights": {"source": SOURCE, "dir": str(weights)},
            "fetch": {"endpoint": endpoint, "token_file": None, "disk_margin": 0.05}}
    text = unit_text(model="gemma", port=port, args="--model ${LLMGW_WEIGHTS}")
    return text.replace('X-Llmgw-Spec={"v":1}',
                        f"X-Llmgw-Spec={json.dumps(spec, separators=(',', ':'))}")


async def test_sigkill_of_the_agent_mid_download_resumes_and_starts(
    root: Path, tmp_path: Path,
) -> None:
    mirror_root = tmp_path / "mirror" / "hub"
    gemma_repo(mirror_root)
    weights = root / "weights"
    size = GEMMA.stat().st_size
    agent = AgentProcess(write_config(root), root / "agent.log")
    with serving(mirror_root, max_rate=40e6) as mirror:
        agent.start()
        try:
            client = await connected(root / "agent.sock")
            text = unit(weights, mirror.url, free_port())
            [result] = await client.apply_units([UnitChange(NAME, text)])
            assert result.ok, result.error
            blobs = weights / "hub" / caches.repo_dir(Path(), GEMMA_REPO).name / "blobs"

            async def under_way() -> int | None:
                report = await client.report()
                fetches = [f for f in report.fetches if f.target == SOURCE]
                states = [u.state for u in report.units if u.name == NAME]
                if fetches and states == ["fetching"] and fetches[0].bytes_done > size // 4:
                    assert fetches[0].bytes_total == size and fetches[0].units == [NAME]
                    return fetches[0].bytes_done
                return None

            await eventually(under_way, timeout=120, what="a quarter fetched")
            assert agent.signal(signal.SIGKILL) == -signal.SIGKILL
            kept = next(blobs.glob("*.incomplete")).stat().st_size
            assert 0 < kept < size
            before = mirror.sent

            agent.start()
            client = await connected(root / "agent.sock")

            async def ready() -> int | None:
                units = [u for u in (await client.report()).units if u.name == NAME]
                return units[0].pid if units and units[0].state == "ready" else None

            pid = await eventually(ready, timeout=120, what="the engine ready after the resume")
            assert mirror.sent - before == size - kept  # only the missing bytes moved
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            path = argv[argv.index("--model") + 1]
            assert path.startswith(f"{weights}/hub/models--google--gemma-3-270m-it-GGUF/snapshots/")
            assert Path(path).stat().st_size == size
            report = await client.report()
            [cached] = report.cached_weights
            assert (cached.source, cached.used_by) == (SOURCE, [NAME])
            [gone] = await client.apply_units([UnitChange(NAME, text, action="remove")])
            assert gone.ok
        finally:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.signal(signal.SIGTERM)
