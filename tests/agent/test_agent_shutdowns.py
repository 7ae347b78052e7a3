"""``Shutdown``: the agent stops itself, and uninstalls what ``node add`` put there.

The rules are a table (:func:`llmgw.agent.shutdowns.decide`); the real path is
``llmgw agent serve``'s :func:`~llmgw.agent.servers.serve` on a unix socket,
asked over gRPC, exiting, and deleting its prefix as it goes.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from agent_support import node_settings, short_dir, unit_name, unit_text

from llmgw.agent import servers, shutdowns
from llmgw.proto.conversions import UnitChange
from llmgw.transport.agent_client import AgentClient

PREFIX = Path("/opt/llmgw")
UNIT_FILE = Path("/etc/systemd/system/llmgw-agent.service")
OURS = shutdowns.Install(PREFIX, None)
OURS_SYSTEMD = shutdowns.Install(PREFIX, UNIT_FILE)
HAND_MADE = shutdowns.Install(None, None)


@pytest.mark.parametrize(("install", "uninstall", "systemd", "can_delete", "expected"), [
    pytest.param(OURS, False, False, True,
                 ("supervise backend: nothing starts it again", [], [], False),
                 id="stop-supervise"),
    pytest.param(OURS_SYSTEMD, False, True, True,
                 ("llmgw-agent.service disabled", [], [], True),
                 id="stop-systemd-disables"),
    pytest.param(OURS_SYSTEMD, True, True, True,
                 ("llmgw-agent.service disabled", [str(UNIT_FILE), str(PREFIX)],
                  [], True), id="uninstall-systemd-deletes-unit-and-prefix"),
    pytest.param(OURS, True, False, True,
                 ("supervise backend: nothing starts it again", [str(PREFIX)], [],
                  False), id="uninstall-supervise"),
    pytest.param(OURS, True, False, False,
                 ("supervise backend: nothing starts it again", [],
                  [f"rm -rf {PREFIX}"], False), id="uninstall-cannot-delete-leaves-it"),
    pytest.param(HAND_MADE, False, True, True,
                 ("no llmgw-agent.service of node add's to disable", [], [], False),
                 id="stop-hand-made"),
])
def test_what_a_shutdown_does(install: shutdowns.Install, uninstall: bool, systemd: bool,
                              can_delete: bool,
                              expected: tuple[str, list[str], list[str], bool]) -> None:
    decision = shutdowns.decide(install, uninstall=uninstall, systemd=systemd, units=[],
                                dry_run=False, can_delete=can_delete)
    assert (decision.detail, decision.removed, decision.left, decision.disable) == expected


@pytest.mark.parametrize(("install", "uninstall", "units", "dry_run", "refusal"), [
    pytest.param(OURS, True, ["llmgw-m-r0-s0.service"], False, "1 llmgw units remain",
                 id="units-left"),
    pytest.param(OURS, False, ["llmgw-m-r0-s0.service"], False, "remove them first",
                 id="units-left-stop"),
    pytest.param(HAND_MADE, True, [], False, "no install of `llmgw node add` found",
                 id="not-node-adds"),
    pytest.param(HAND_MADE, True, [], True, "no install of `llmgw node add` found",
                 id="not-node-adds-dry-run"),
])
def test_refusals(install: shutdowns.Install, uninstall: bool, units: list[str],
                  dry_run: bool, refusal: str) -> None:
    with pytest.raises(shutdowns.ShutdownRefused, match=refusal.replace("`", ".")):
        shutdowns.decide(install, uninstall=uninstall, systemd=False, units=units,
                         dry_run=dry_run, can_delete=True)


def test_a_dry_run_ignores_units_it_will_not_find_later() -> None:
    decision = shutdowns.decide(OURS, uninstall=True, systemd=False, units=["u.service"],
                                dry_run=True, can_delete=True)
    assert decision.detail == "dry run: supervise backend: nothing starts it again"
    assert decision.removed == [str(PREFIX)]


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def node_add_prefix(root: Path) -> Path:
    """What `node add` leaves in a prefix, as far as Shutdown checks it."""
    prefix = root / "opt"
    for marker in shutdowns.MARKERS:
        (prefix / marker).parent.mkdir(parents=True, exist_ok=True)
        (prefix / marker).write_text("")
    (prefix / "engines" / "llama.cpp-1.0.0" / "bin").mkdir(parents=True)
    (prefix / "run").mkdir()
    (prefix / "run" / "agent.pid").write_text("1\n")
    return prefix


async def test_uninstall_through_grpc_stops_the_agent_and_deletes_its_prefix(
    root: Path,
) -> None:
    prefix = node_add_prefix(root)
    settings = node_settings("cpu-only", root, state_dir=str(prefix / "state"),
                             engines={"dir": str(prefix / "engines")})
    serving = asyncio.create_task(servers.serve(settings))
    socket = Path(settings.socket.path)
    async with asyncio.timeout(20):
        while not socket.exists():
            await asyncio.sleep(0.02)
    channel = grpc.aio.insecure_channel(f"unix:{socket}")
    client = AgentClient(channel, timeout=20)
    try:
        # A unit still there: refused, nothing done; the agent keeps serving.
        name = unit_name("m1")
        (result,) = await client.apply_units([UnitChange(name, unit_text("m1"),
                                                         action="stop")])
        assert result.ok, result.error
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.shutdown(uninstall=True, dry_run=False)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "1 llmgw units remain on this node" in (refused.value.details() or "")
        dry = await client.shutdown(uninstall=True, dry_run=True)
        assert dry.removed == (str(prefix),) and not serving.done()

        await client.apply_units([UnitChange(name, "", action="remove")])
        stopped = await client.shutdown(uninstall=True, dry_run=False)
        assert stopped.detail == "supervise backend: nothing starts it again"
        assert stopped.removed == (str(prefix),) and stopped.left == ()
        async with asyncio.timeout(20):
            left = await serving  # it stops by itself, and says what is left to do
    finally:
        await channel.close()
        if not serving.done():
            serving.cancel()
    assert left is not None and left.removed == [str(prefix)] and prefix.exists()
    assert not socket.exists()
    shutdowns.finish(left)  # what `llmgw agent serve` does last (there by exec'ing rm)
    assert not prefix.exists()
