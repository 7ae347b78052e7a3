"""The admin API's fleet snapshot, which CI downloads, carries no secret a node reported.

The attack of issue 23: an engine's error line with an ``hf_`` token came back verbatim
from ``GET /api/v1/fleet``. The snapshot must still be one ``llmgw plan --observed``
reads, and a valid unit's spec label must come through unchanged (its digest matches).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmgw.daemon import admin
from llmgw.daemon.reconcilers import Daemon
from llmgw.fleet import redactions
from llmgw.fleet.types import Fleet, NodeReport, Unit
from llmgw.planning import plans
from llmgw.spec.models import Cluster

TOKEN = "admin-token-for-the-test"
HF = "hf_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456"
GITHUB = "ghp_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456789"
# create_app routes to lambdas that return coroutines, which aiohttp warns about.
pytestmark = pytest.mark.filterwarnings("ignore:Bare functions are deprecated:DeprecationWarning")
SPEC = '{"args":{"ctx-size":8192},"source":"/models/gemma.gguf"}'


def _cluster() -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "c"},
        "nodes": {"cpu-01": {"address": "10.0.0.1"}},
        "models": {"gemma": {"source": "/models/gemma.gguf",
                             "profiles": [{"engine": "llama.cpp", "cpu": True}]}},
    })


def _fleet() -> Fleet:
    unit = Unit(name="llmgw-gemma-r0-s0.service", model="gemma", replica=0, digest="d" * 16,
                state="failed", detail=f"exited with status 1 (token {GITHUB})",
                log_tail=["main: loading", f"OSError: 401 for url: token {HF} is invalid"],
                last_exit=f"Authorization: Bearer {GITHUB}",
                labels={"X-Llmgw-Digest": "d" * 16, "X-Llmgw-Spec": SPEC})
    return Fleet(nodes={"cpu-01": NodeReport(node="cpu-01", reachable=True, units=[unit]),
                        "cpu-02": NodeReport(node="cpu-02", reachable=False,
                                             error=f"ssh: auth token={HF} refused")})


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Daemon]]:
    daemon = Daemon(tmp_path, _cluster(), clock=lambda: 1000.0)
    daemon.state.fleet = _fleet()
    daemon.state.plan = plans.plan(daemon.state.cluster, daemon.state.fleet, 1000.0)
    runner = web.AppRunner(admin.create_app(daemon, TOKEN), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}", daemon
    finally:
        await runner.cleanup()


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(
            url, headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status == 200, await response.text()
        return await response.text()


async def test_the_fleet_snapshot_carries_no_token_a_node_reported(
    served: tuple[str, Daemon],
) -> None:
    base, daemon = served
    body = await _get(f"{base}/api/v1/fleet")
    assert HF not in body and GITHUB not in body
    snapshot = Fleet.model_validate_json(body)  # still what `plan --observed` reads
    [unit] = snapshot.nodes["cpu-01"].units
    assert unit.log_tail == ["main: loading", "OSError: 401 for url: token [redacted] is invalid"]
    assert unit.last_exit == "Authorization: Bearer [redacted]"
    assert unit.labels["X-Llmgw-Spec"] == SPEC  # a valid unit's label is left as it was


@pytest.mark.parametrize("path", ["/api/v1/status", "/api/v1/plan?format=json",
                                  "/api/v1/plan?format=markdown", "/api/v1/plan?format=text"])
async def test_status_and_plans_carry_no_token_either(
    served: tuple[str, Daemon], path: str,
) -> None:
    base, _ = served
    body = await _get(f"{base}{path}")
    assert HF not in body and GITHUB not in body


def test_a_snapshot_without_secrets_comes_through_unchanged() -> None:
    """The example's snapshot (GPU UUIDs, digests, spec labels, paths, cpu flags, NCCL
    environments): nothing in it looks like a secret, so scrubbing changes nothing."""
    example = Path(__file__).parents[2] / "cluster.example" / "fleet-snapshot.json"
    fleet = Fleet.model_validate_json(example.read_text())
    assert Fleet.model_validate_json(redactions.public_json(fleet)) == fleet
