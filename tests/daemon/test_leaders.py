"""The leader lease on a real PostgreSQL: one leader, fencing, hand-over.

The partition is real: leader ``a`` reaches PostgreSQL through a TCP proxy
that the test freezes, so its renewals hang exactly as on a cut link.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from support.postgres import Database
from support.proxies import FreezableProxy

from llmgw.daemon.leaders import LEASE, STANDBY_POLL, Leadership, NotLeader
from llmgw.spec.models import StoreSettings
from llmgw.store import stores
from llmgw.store.stores import Store


@dataclass
class Interval:
    holder: str
    epoch: int
    start: float
    end: float = 0.0


async def open_(db: Database, port: int | None = None) -> Store:
    url = db.url if port is None else db.url.replace(
        db.url.split("@")[1].split("/")[0], f"127.0.0.1:{port}")
    return await stores.open_store(StoreSettings(url=url, password_file=str(db.password_file)))


async def apply_while_leading(lead: Leadership, log: list[Interval], stop: asyncio.Event) -> None:
    """Apply over and over, fenced, recording when each apply ran and under which epoch."""
    async def apply() -> None:
        assert lead.epoch is not None
        interval = Interval(lead.holder, lead.epoch, time.monotonic())
        log.append(interval)
        try:
            for _ in range(10):  # a multi-step apply: each step yields, like an RPC
                await asyncio.sleep(0.03)
        finally:
            interval.end = time.monotonic()

    while not stop.is_set():
        if lead.is_leader():
            with contextlib.suppress(NotLeader):
                await lead.fenced(apply())
        else:
            await asyncio.sleep(0.02)


async def wait_for(check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_two_leaders_never_apply_at_once(postgres_db: Database) -> None:
    probe = await open_(postgres_db)
    await probe.close()  # migrated
    host, port = "127.0.0.1", int(postgres_db.url.split(":")[-1].split("/")[0])
    proxy = await FreezableProxy(host, port).start()
    store_a, store_b = await open_(postgres_db, proxy.port), await open_(postgres_db)
    a, b = Leadership(store_a, 2.0, holder="a"), Leadership(store_b, 2.0, holder="b")
    log: list[Interval] = []
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop_a)),
             asyncio.create_task(apply_while_leading(a, log, stop_a))]
    await wait_for(a.is_leader)
    tasks += [asyncio.create_task(b.run(stop_b)),
              asyncio.create_task(apply_while_leading(b, log, stop_b))]
    await wait_for(lambda: sum(i.holder == "a" for i in log) >= 5)
    assert not b.is_leader()

    proxy.freeze()  # a can no longer renew; it must stop applying before b may take over
    await wait_for(b.is_leader)
    await wait_for(lambda: sum(i.holder == "b" for i in log) >= 5)
    proxy.thaw()
    await wait_for(lambda: a.epoch is None)  # a learns it lost, and stays out
    applied = sum(i.holder == "b" for i in log)
    await wait_for(lambda: sum(i.holder == "b" for i in log) >= applied + 5)  # while b applies
    stop_a.set()
    stop_b.set()
    await asyncio.gather(*tasks)
    await proxy.close()

    assert {i.epoch for i in log if i.holder == "a"} == {1}
    assert {i.epoch for i in log if i.holder == "b"} == {2}
    ordered = sorted(log, key=lambda i: i.start)
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert before.end <= after.start, f"{before} overlaps {after}"
    last_a = max(i.end for i in log if i.holder == "a")
    first_b = min(i.start for i in log if i.holder == "b")
    assert last_a <= first_b
    await store_a.close()
    await store_b.close()


async def test_a_clean_stop_hands_over_at_once(postgres_db: Database) -> None:
    store_a, store_b = await open_(postgres_db), await open_(postgres_db)
    a, b = Leadership(store_a, 60.0, holder="a"), Leadership(store_b, 60.0, holder="b")
    try:
        await a.try_once()
        assert a.is_leader()
        await b.try_once()
        assert not b.is_leader() and b.leader is not None and b.leader.holder == "a"
        await a.release()  # what a clean stop does
        await b.try_once()  # the very next try, not a minute later
        assert b.is_leader() and b.epoch == 2 and not a.is_leader()
    finally:
        await store_a.close()
        await store_b.close()


async def test_a_standby_tries_again_when_the_lease_expires(postgres_db: Database) -> None:
    store_a, store_b = await open_(postgres_db), await open_(postgres_db)
    a, b = Leadership(store_a, 9.0, holder="a"), Leadership(store_b, 9.0, holder="b")
    try:
        await a.try_once()
        delay = await b.try_once()
        held = await store_b.lease(LEASE)
        assert held is not None and held.holder == "a"
        # The standby sleeps until the holder's lease would expire (and no longer): after a
        # leader dies, the standby leads within lease_ttl of its last renewal.
        assert delay <= held.remaining + 0.05 + 0.5
        assert delay <= STANDBY_POLL  # and soon enough to notice a release at once
    finally:
        await store_a.close()
        await store_b.close()


async def test_the_leader_deadline_falls_before_the_database_expiry(
        postgres_db: Database) -> None:
    store = await open_(postgres_db)
    lead = Leadership(store, 20.0, holder="a")
    try:
        await lead.try_once()
        held = await store.lease(LEASE)
        assert held is not None
        assert lead.remaining() <= held.remaining - lead.margin + 0.5
        assert lead.remaining() < held.remaining
    finally:
        await store.close()


async def test_a_deposed_leader_cannot_publish_routes(postgres_db: Database) -> None:
    store = await open_(postgres_db)
    try:
        grant = await store.acquire_lease(LEASE, "a", 30)
        assert grant is not None
        assert await store.publish_routes(LEASE, "a", grant.epoch, '{"routes": {}}')
        await store.release_lease(LEASE, "a")
        assert await store.acquire_lease(LEASE, "b", 30) is not None
        assert not await store.publish_routes(LEASE, "a", grant.epoch, '{"routes": {"x": []}}')
        published = await store.published_routes(LEASE)
        assert published is not None and published.doc == '{"routes": {}}'
    finally:
        await store.close()
