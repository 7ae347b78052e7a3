"""The agent's fetch queue: units wait as `fetching`, one download per node, then start."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from mirror_support import GEMMA, GEMMA_REPO, gemma_repo, serving
from support import nodes

from llmgw.agent import fetchers
from llmgw.agent.units import UnitChange, UnitResult

pytestmark = pytest.mark.skipif(not GEMMA.exists(), reason="run `make model` (make test does)")
SOURCE = f"{GEMMA_REPO}:Q4_K_M"


def change(replica: int, weights_dir: Path, endpoint: str) -> UnitChange:
    name = f"llmgw-gemma-r{replica}-s0.service"
    spec = {"weights": {"source": SOURCE, "dir": str(weights_dir)},
            "fetch": {"endpoint": endpoint, "token_file": None, "disk_margin": 0.05}}
    text = ("[Unit]\nX-Llmgw-Model=gemma\n"
            f"X-Llmgw-Replica={replica}\nX-Llmgw-Rank=0\nX-Llmgw-Digest=d\n"
            f"X-Llmgw-Spec={json.dumps(spec)}\n\n[Service]\n"
            "ExecStart=/usr/bin/env llama-server --model ${LLMGW_WEIGHTS}\n")
    return UnitChange(name=name, unit_text=text, env_text="A=1\n")


async def test_two_units_on_one_node_wait_for_one_download(tmp_path: Path) -> None:
    root = tmp_path / "mirror" / "hub"
    gemma_repo(root)
    started: list[UnitChange] = []

    async def start(changes: Sequence[UnitChange]) -> list[UnitResult]:
        started.extend(changes)
        return [UnitResult(c.name, ok=True, changed=True) for c in changes]

    node = tmp_path / "node"
    with serving(root) as mirror:
        fetcher = fetchers.Fetcher(tmp_path / "state", start, lambda: None)
        first = [change(0, node, mirror.url), change(1, node, mirror.url)]
        now = await fetcher.admit(first)
        assert [c.action for c in now] == ["stop", "stop"]  # files written, not started
        assert fetcher.overlay(first[0].name)[0] == "fetching"  # type: ignore[index]
        for _ in range(600):
            if len(started) == 2:
                break
            await asyncio.sleep(0.1)
        assert mirror.sent == GEMMA.stat().st_size  # one download for both units
        report = fetcher.reports()
        assert [(f.state, f.bytes_done, f.bytes_total) for f in report] == [
            ("done", GEMMA.stat().st_size, GEMMA.stat().st_size)]
        assert {c.name for c in started} == {c.name for c in first}
        for unit in started:
            assert unit.action == "start"
            assert "LLMGW_WEIGHTS=" in unit.env_text and "HF_HUB_OFFLINE=" in unit.env_text
            assert unit.env_text.startswith("A=1\n")
        assert fetcher.overlay(first[0].name) is None
        assert not list((tmp_path / "state" / "fetches").glob("*.json"))
        # Present now: a third replica starts at once, with nothing fetched.
        third = await fetcher.admit([change(2, node, mirror.url)])
        assert third[0].action == "start" and "LLMGW_WEIGHTS=" in third[0].env_text
        assert mirror.sent == GEMMA.stat().st_size
        await fetcher.close()


async def test_a_failed_fetch_fails_its_units_with_the_reason(tmp_path: Path) -> None:
    async def start(changes: Sequence[UnitChange]) -> list[UnitResult]:
        raise AssertionError("nothing may start without its weights")

    fetcher = fetchers.Fetcher(tmp_path / "state", start, lambda: None)
    closed = f"http://127.0.0.1:{nodes.free_port()}"  # nothing listens there
    unit = change(0, tmp_path / "node", closed)
    await fetcher.admit([unit])
    for _ in range(300):
        held = fetcher.overlay(unit.name)
        if held and held[0] == "failed":
            break
        await asyncio.sleep(0.1)
    assert held is not None and held[0] == "failed"
    assert f"cannot reach {closed}" in held[1]
    assert fetcher.reports()[0].error
    await fetcher.close()
