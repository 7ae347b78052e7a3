"""/admin in the HA layout: the leader's summary through the store, as a router shows it.

The leader's state is a real :class:`Daemon`'s (a fleet whose units reported
tokens in their log tails); the store is SQLite and a real PostgreSQL; the
lease is the real one. A router's :class:`Reader` reads what the leader's
:class:`Publisher` wrote, and the page's view is built from it. The
processes end to end are ``tests/e2e/test_ha.py::test_a_routers_admin_shows_the_leaders_fleet``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmgw.daemon import admin, publications
from llmgw.daemon.leaders import LEASE, Leadership
from llmgw.daemon.reconcilers import Daemon
from llmgw.fleet.types import Fleet, NodeReport, Unit
from llmgw.planning import plans
from llmgw.spec.models import Cluster, StoreSettings
from llmgw.store import stores
from llmgw.store.stores import Grant, Store

HF = "hf_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456"
GITHUB = "ghp_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456789"
TOKEN = "admin-token-for-the-test"
pytestmark = pytest.mark.filterwarnings("ignore:Bare functions are deprecated:DeprecationWarning")


def _cluster() -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "c"},
        "nodes": {"cpu-01": {"address": "10.0.0.1"}, "cpu-02": {"address": "10.0.0.2"}},
        "models": {"gemma": {"source": "/models/gemma.gguf",
                             "profiles": [{"engine": "llama.cpp", "cpu": True}]}},
    })


def _fleet(state: str = "ready") -> Fleet:
    unit = Unit(name="llmgw-gemma-r0-s0.service", model="gemma", replica=0, digest="d" * 16,
                state=state, detail=f"exited with status 1 (token {GITHUB})", port=8100,
                log_tail=["main: loading", f"OSError: 401 for url: token {HF} is invalid"],
                last_exit=f"Authorization: Bearer {GITHUB}")
    return Fleet(nodes={"cpu-01": NodeReport(node="cpu-01", reachable=True, units=[unit]),
                        "cpu-02": NodeReport(node="cpu-02", reachable=False,
                                             error=f"ssh: auth token={HF} refused")})


def _daemon(directory: Path, fleet: Fleet) -> Daemon:
    daemon = Daemon(directory, _cluster(), clock=lambda: 1000.0)
    daemon.state.fleet, daemon.state.observed_at = fleet, 1000.0
    daemon.state.plan = plans.plan(daemon.state.cluster, fleet, 1000.0)
    return daemon


@pytest.fixture
async def store(store_settings: dict[str, str]) -> AsyncIterator[Store]:
    opened = await stores.open_store(StoreSettings.model_validate(store_settings))
    try:
        yield opened
    finally:
        await opened.close()


async def _reader(store: Store) -> publications.Reader:
    """A router's reader after one read, with someone looking at /admin."""
    reader = publications.Reader(store)
    assert reader.view(_cluster(), 1000.0) is None  # nothing read yet: wanted from now on
    await reader.step()
    return reader


async def _leader(store: Store, holder: str) -> Leadership:
    lead = Leadership(store, 30.0, holder=holder)
    await lead.try_once()
    assert lead.is_leader()
    return lead


async def test_a_router_shows_the_leaders_fleet_scrubbed_with_its_holder_and_age(
    store: Store, tmp_path: Path,
) -> None:
    lead = await _leader(store, "vm:1234:ab12")
    publisher = publications.Publisher(_daemon(tmp_path, _fleet()), store, lead)
    assert await publisher.step()
    published = await store.published_summary(LEASE)
    assert published is not None and published.doc is not None
    assert HF not in published.doc and GITHUB not in published.doc
    reader = await _reader(store)
    view = reader.view(_cluster(), 1000.0)
    assert view is not None and view.fleet is not None
    assert view.source is not None
    assert view.source.startswith("summary from vm:1234:ab12 (leader), ")
    assert view.source.endswith(" s old") and view.stale is None
    assert [r.model for r in view.summary.replicas] == ["gemma"]
    assert view.summary.unreachable == ["cpu-02"]
    [unit] = view.fleet.nodes["cpu-01"].units
    assert unit.log_tail == ["main: loading", "OSError: 401 for url: token [redacted] is invalid"]
    assert view.fleet.nodes["cpu-02"].error == "ssh: auth token=[redacted] refused"
    assert view.plan_summary is not None and view.plan_summary.startswith("Plan:")


async def test_unchanged_it_is_not_written_again_and_not_read_again(
    store: Store, tmp_path: Path,
) -> None:
    lead = await _leader(store, "vm:1:aa")
    daemon = _daemon(tmp_path, _fleet())
    # A clock that stands still: REFRESH never passes, and building takes no time.
    publisher = publications.Publisher(daemon, store, lead, clock=lambda: 50.0)
    assert await publisher.step()
    assert not await publisher.step()  # nothing changed
    first = await store.published_summary(LEASE)
    assert first is not None
    again = await store.published_summary(LEASE, seen=first.seq)
    assert again is not None and again.doc is None and again.seq == first.seq
    daemon.state.fleet = _fleet("failed")  # the next observation: a changed page
    assert await publisher.step()
    changed = await store.published_summary(LEASE, seen=first.seq)
    assert changed is not None and changed.seq == first.seq + 1 and changed.doc is not None


async def test_a_router_nobody_looks_at_does_not_fetch_the_document(
    store: Store, tmp_path: Path,
) -> None:
    lead = await _leader(store, "vm:1:aa")
    assert await publications.Publisher(_daemon(tmp_path, _fleet()), store, lead).step()
    reader = publications.Reader(store)
    await reader.step()
    assert reader.published is not None and reader.published.doc is None
    assert reader.record is None
    assert reader.absent().startswith("Reading the leader's summary")  # someone looks now
    await reader.step()
    assert reader.view(_cluster(), 1000.0) is not None


async def test_a_deposed_leader_cannot_overwrite_the_new_leaders_summary(
    store: Store, tmp_path: Path,
) -> None:
    old = await _leader(store, "vm:1:aa")
    stale_publisher = publications.Publisher(_daemon(tmp_path, _fleet()), store, old)
    await store.release_lease(LEASE, old.holder)  # its lease ends; it has not noticed yet
    new = await _leader(store, "vm:2:bb")
    assert await publications.Publisher(_daemon(tmp_path, _fleet("failed")), store,
                                        new).step()
    assert old.is_leader()  # by its own clock it still leads: only the database refuses
    assert not await stale_publisher.step()
    published = await store.published_summary(LEASE)
    assert published is not None and published.holder == "vm:2:bb"
    reader = await _reader(store)
    view = reader.view(_cluster(), 1000.0)
    assert view is not None and view.source is not None
    assert view.source.startswith("summary from vm:2:bb (leader)")


async def test_a_summary_over_the_bound_carries_no_fleet_and_the_page_says_why(
    store: Store, tmp_path: Path,
) -> None:
    lead = await _leader(store, "vm:1:aa")
    publisher = publications.Publisher(_daemon(tmp_path, _fleet()), store, lead, limit=512)
    assert await publisher.step()
    published = await store.published_summary(LEASE)
    assert published is not None and published.doc is not None
    assert len(published.doc) < 2048  # the fleet was left out
    reader = await _reader(store)
    assert reader.view(_cluster(), 1000.0) is None
    assert "MiB" in reader.absent() and "over the" in reader.absent()


async def test_before_any_leader_published_the_page_says_so(store: Store) -> None:
    reader = await _reader(store)
    assert reader.view(_cluster(), 1000.0) is None
    assert reader.absent().startswith("No reconciler has published a summary yet")


def _grant(holder: str) -> Grant:
    return Grant(LEASE, holder, 3, 10.0)


@pytest.mark.parametrize("leader, age, source, stale", [
    pytest.param(_grant("vm:1:aa"), 4.2, "summary from vm:1:aa (leader), 4 s old", None,
                 id="fresh, from the leader"),
    pytest.param(_grant("vm:2:bb"), 3.0,
                 "summary from vm:1:aa (no longer leads; vm:2:bb leads now), 3 s old",
                 "vm:1:aa no longer leads", id="the leader changed, the new one not yet"),
    pytest.param(None, 5.0, "summary from vm:1:aa (no reconciler leads now), 5 s old",
                 "No reconciler leads now", id="no leader"),
    pytest.param(_grant("vm:1:aa"), 47.0, "summary from vm:1:aa (leader), 47 s old",
                 "Stale: this summary is 47 s old", id="stale beyond the bound"),
    pytest.param(_grant("vm:1:aa"), 600.0, "summary from vm:1:aa (leader), 10 min old",
                 "Stale: this summary is 10 min old", id="minutes"),
])
def test_the_page_says_whose_summary_and_how_old(
    leader: Grant | None, age: float, source: str, stale: str | None,
) -> None:
    assert publications.source("vm:1:aa", leader, age) == source
    said = publications.stale("vm:1:aa", leader, age)
    assert (said is None) if stale is None else (said is not None and said.startswith(stale))


@pytest.mark.parametrize("text, error", [
    pytest.param("{", "not an admin summary", id="not JSON"),
    pytest.param('{"format": 2, "fleet": null}', "format 2", id="a newer format"),
    pytest.param('{"format": 1, "fleet": {"nodes": 3}}', "not an admin summary",
                 id="a fleet that is not one"),
])
def test_a_summary_this_llmgw_cannot_read_is_refused_with_a_reason(text: str,
                                                                   error: str) -> None:
    with pytest.raises(ValueError, match=error):
        publications.decode(text)


@pytest.fixture
async def admin_api(tmp_path: Path) -> AsyncIterator[str]:
    runner = web.AppRunner(admin.create_app(_daemon(tmp_path, _fleet()), TOKEN),
                           access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("path", ["/admin", "/admin/live", "/chat", "/login", "/"])
async def test_a_reconcilers_admin_listener_says_where_the_pages_are(
    admin_api: str, path: str,
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{admin_api}{path}", allow_redirects=False) as answer:
            assert answer.status == 404
            text = await answer.text()
        assert "served by routers, on the router listener" in text
        assert "listeners.router is 127.0.0.1:8000" in text
        async with session.get(f"{admin_api}/api/v1/status") as api:
            assert api.status == 401  # the API itself still wants the token
