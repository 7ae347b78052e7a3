"""/admin in the HA layout: the leader publishes what the page shows, routers read it.

A router in its own process (``--role router``, or a ``--workers`` process) has
no reconcile loop, so it has nothing of its own to show on /admin. The
leading reconciler publishes its admin summary to the store, beside the
routing table and for the same reasons (:mod:`llmgw.daemon.routetables`):
routers need the store anyway, and a router never depends on which
reconciler leads.

* **What is published**: the observed fleet itself (so every page drawn
  from it — the summary, the nodes — works on a router as on the leader),
  the revisions, the plan, the last apply, a refused edit, the last use per
  model (the demand every router reported), each as the leader's
  ``/admin`` shows it. Every string in it goes through the secrets scrubber
  (:func:`llmgw.fleet.redactions.scrubbed`), as the fleet does on
  ``/api/v1/fleet``; on routers it is shown to admins only.
* **When**: the :class:`Publisher` looks every :data:`CHECK_INTERVAL`
  seconds; it writes when what the page shows changed, and at least every
  :data:`REFRESH` seconds, fenced by the lease (a deposed leader's write is
  refused by the database). A document above :data:`MAX_BYTES` is not
  written whole: the fleet is left out and routers say why.
* **How routers show it**: the :class:`Reader` polls the row and the lease,
  and /admin says whose summary it is and how old, by the database's clock:
  ``summary from vm:1234:ab12 (leader), 4 s old``. Older than
  :data:`STALE_AFTER`, or from a reconciler that no longer leads, the page
  says so plainly. The document is downloaded and decoded only when it
  changed and only while someone looks at /admin (within :data:`WANTED_FOR`
  seconds): the example fleet takes 4.5 KiB a node, and decoding a thousand
  nodes costs a router seconds of CPU it should spend on requests.
* **Cost on the leader**: building the document takes time too (a thousand
  nodes: seconds), so the leader builds at most once per four times the last
  build took.

Usage::

    publisher = Publisher(daemon, store, leadership)   # in a reconciler
    await publisher.run(stop)
    reader = Reader(store)                             # in a router
    await reader.run(stop); reader.view(cluster, time.time())
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from llmgw.daemon import admin
from llmgw.daemon.leaders import LEASE, Leadership
from llmgw.daemon.reconcilers import Daemon
from llmgw.fleet import redactions
from llmgw.fleet.types import Fleet
from llmgw.planning import outputs, summaries
from llmgw.spec.models import Cluster
from llmgw.store.adminsummaries import PublishedSummary
from llmgw.store.stores import Grant, Store, StoreError
from llmgw.web import AdminView

log = logging.getLogger("llmgw.publications")
FORMAT = 1  # of the document; a router ignores one of another format
CHECK_INTERVAL = 1.0  # seconds between the leader's looks at what /admin shows
REFRESH = 10.0  # the leader writes at least this often, so routers can tell it lives
STALE_AFTER = 30.0  # a summary older than this is called stale on the page
READ_INTERVAL = 2.0  # seconds between a router's reads (the page refreshes every 10 s)
WANTED_FOR = 60.0  # a router fetches the document while /admin was viewed this recently
MAX_BYTES = 16 * 1024 * 1024  # bound of one document: some 3,600 nodes of 4.5 KiB


@dataclass(frozen=True)
class Record:
    """The leader's summary as a router decoded it."""

    fleet: Fleet | None  # None when the leader's was over MAX_BYTES
    too_large: int | None = None  # the bytes the whole document would have taken
    observed_at: float | None = None
    revision: str | None = None
    applied_revision: str | None = None
    sync: str = "manual"
    plan_summary: str | None = None
    plan_text: str | None = None
    planned_at: float | None = None
    last_apply: str | None = None
    last_apply_ok: bool | None = None
    applied_at: float | None = None
    refused: list[str] = field(default_factory=list)
    last_used: dict[str, float] = field(default_factory=dict)


def document(daemon: Daemon) -> dict[str, Any] | None:
    """What the leader's /admin shows, as JSON-shaped data, every string scrubbed; None
    before the first observation. Runs off the event loop (a big fleet takes a while)."""
    state = daemon.state
    if state.fleet is None:
        return None
    plan, outcome = state.plan, state.outcome
    doc = {
        "format": FORMAT,
        "fleet": state.fleet.model_dump(mode="json"),
        "observed_at": state.observed_at, "revision": state.revision,
        "applied_revision": state.applied_revision, "sync": state.cluster.cluster.sync,
        "plan_summary": plan.summary() if plan else None,
        "plan_text": outputs.text(plan) if plan else None, "planned_at": state.planned_at,
        "last_apply": outcome.summary() if outcome else None,
        "last_apply_ok": outcome.ok if outcome else None, "applied_at": state.applied_at,
        "refused": [line.replace(f"{state.directory}/", "") for line in state.refused],
        "last_used": daemon.demand().last_used,
    }
    scrubbed: dict[str, Any] = redactions.scrubbed(doc)
    return scrubbed


def encode(doc: dict[str, Any], limit: int = MAX_BYTES) -> str:
    """``doc`` as the stored text; over ``limit`` bytes, without its fleet (and saying so)."""
    text = json.dumps(doc, separators=(",", ":"))
    if len(text.encode()) <= limit:
        return text
    return json.dumps({**doc, "fleet": None, "too_large": len(text.encode())},
                      separators=(",", ":"))


def decode(text: str) -> Record:
    """The record in ``text``; ValueError when it is not one (a newer llmgw's, say)."""
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, this llmgw reads {FORMAT}")
        fleet = None if doc["fleet"] is None else Fleet.model_validate(doc["fleet"])
        return Record(
            fleet=fleet, too_large=_int(doc.get("too_large")),
            observed_at=_float(doc.get("observed_at")), revision=_str(doc.get("revision")),
            applied_revision=_str(doc.get("applied_revision")), sync=str(doc.get("sync")),
            plan_summary=_str(doc.get("plan_summary")), plan_text=_str(doc.get("plan_text")),
            planned_at=_float(doc.get("planned_at")), last_apply=_str(doc.get("last_apply")),
            last_apply_ok=None if doc.get("last_apply_ok") is None
            else bool(doc["last_apply_ok"]),
            applied_at=_float(doc.get("applied_at")),
            refused=[str(line) for line in doc.get("refused") or []],
            last_used={str(m): float(at) for m, at in (doc.get("last_used") or {}).items()})
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
        raise ValueError(f"not an admin summary: {exc}") from None


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _float(value: object) -> float | None:
    return None if value is None else float(str(value))


def _int(value: object) -> int | None:
    return None if value is None else int(str(value))


class Publisher:
    """The leader's side: write the admin summary when it changes, and every REFRESH s."""

    def __init__(self, daemon: Daemon, store: Store, leadership: Leadership, *,
                 clock: Callable[[], float] = time.monotonic, limit: int = MAX_BYTES) -> None:
        self.daemon = daemon
        self.store = store
        self.leadership = leadership
        self.clock = clock
        self.limit = limit
        self._shown: tuple[Any, ...] | None = None  # what the last document was built from
        self._text: str | None = None
        self._built: tuple[float, float] | None = None  # when the last build began; its time
        self._written: tuple[int, str | None, float] | None = None  # epoch, text, when
        self._failing = False
        self._too_large_said = False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), CHECK_INTERVAL)

    async def step(self) -> bool:
        """Publish if due; True when written."""
        epoch = self.leadership.epoch
        if epoch is None or not self.leadership.is_leader():
            self._written = None  # leading again later: write at once
            return False
        state = self.daemon.state
        # Identity of what the document is built from: each observation, plan and apply
        # makes new objects, so a changed page means a changed key.
        shown = (id(state.fleet), id(state.plan), id(state.outcome), tuple(state.refused),
                 state.revision, state.applied_revision, state.cluster.cluster.sync)
        now = self.clock()
        if shown != self._shown and (self._built is None
                                     or now - self._built[0] >= 4 * self._built[1]):
            doc = await asyncio.to_thread(document, self.daemon)
            self._text = None if doc is None else await asyncio.to_thread(
                encode, doc, self.limit)
            self._shown = shown
            self._built = (now, self.clock() - now)
        text = self._text
        if text is None:
            return False
        if self._written is not None:
            written_epoch, written_text, at = self._written
            if written_epoch == epoch and written_text == text and now - at < REFRESH:
                return False
        if '"too_large":' in text and not self._too_large_said:
            log.warning("the admin summary is over %d MiB: routers' /admin shows no fleet",
                        self.limit // 2**20)
            self._too_large_said = True
        try:
            done = await self.store.publish_summary(LEASE, self.leadership.holder, epoch, text)
        except StoreError as exc:
            if not self._failing:
                log.warning("cannot publish the admin summary (routers show the last one): "
                            "%s", exc)
            self._failing = True
            return False
        self._failing = False
        if done:
            self._written = (epoch, text, now)
        return done


class Reader:
    """A router's side: the leader's last summary, and who leads now, read every 2 s."""

    def __init__(self, store: Store, *, interval: float = READ_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.interval = interval
        self.clock = clock
        self.published: PublishedSummary | None = None  # the header last read
        self.record: Record | None = None
        self.shown: PublishedSummary | None = None  # the header ``record`` came with
        self.error: str | None = None  # why the record cannot be shown
        self.leader: Grant | None = None
        self.read_at: float | None = None  # clock() of the last answer
        self.record_read_at: float | None = None  # clock() when ``record`` was read
        self.wanted_at: float | None = None  # clock() of the last look at /admin
        self._failing = False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def step(self) -> None:
        seen = self.shown.seq if self.shown is not None else None
        wanted = self.wanted_at is not None and self.clock() - self.wanted_at < WANTED_FOR
        try:
            published = await self.store.published_summary(LEASE, seen, body=wanted)
            leader = await self.store.lease(LEASE)
        except StoreError as exc:
            if not self._failing:
                log.warning("cannot read the leader's admin summary: %s", exc)
            self._failing = True
            return
        self._failing = False
        self.leader, self.read_at = leader, self.clock()
        if published is not None and published.doc is not None:
            try:
                record = await asyncio.to_thread(decode, published.doc)
                self.record, self.error = record, None
            except ValueError as exc:
                self.record, self.error = None, f"the leader's summary cannot be read: {exc}"
            self.shown, self.record_read_at = published, self.clock()
        self.published = published

    def age(self) -> float | None:
        """Seconds since the summary shown was written: the database's answer plus the
        time since that answer."""
        if self.shown is None or self.record_read_at is None:
            return None
        return self.shown.age + max(0.0, self.clock() - self.record_read_at)

    def absent(self) -> str:
        """What /admin says while there is no view."""
        self.wanted_at = self.clock()
        if self.error:
            return self.error
        record = self.record
        if record is not None and record.fleet is None and record.too_large:
            return (f"The leader's summary is {record.too_large / 2**20:.1f} MiB, over the "
                    f"{MAX_BYTES // 2**20} MiB a published summary may take, so routers show "
                    "no fleet: ask the leader's admin API (`llmgw status`).")
        if self.published is not None:
            return ("Reading the leader's summary from the store; this page shows it at its "
                    "next refresh.")
        return ("No reconciler has published a summary yet: routers show the fleet the "
                "leading reconciler publishes to the store.")

    def view(self, cluster: Cluster, now: float) -> AdminView | None:
        """The page's view of the leader's last summary; None when there is none (or it
        was not fetched yet: asking for it makes the next reads fetch it)."""
        self.wanted_at = self.clock()
        record, published, age = self.record, self.shown, self.age()
        if record is None or record.fleet is None or published is None or age is None:
            return None
        fleet = record.fleet
        return AdminView(
            summary=summaries.summarize(cluster, fleet, now, record.last_used),
            observed_at=record.observed_at, revision=record.revision,
            applied_revision=record.applied_revision, sync=record.sync,
            plan_summary=record.plan_summary, plan_text=record.plan_text,
            planned_at=record.planned_at, last_apply=record.last_apply,
            last_apply_ok=record.last_apply_ok, applied_at=record.applied_at,
            refused=record.refused, progress=admin.progress(fleet), fleet=fleet,
            source=source(published.holder, self.leader, age),
            stale=stale(published.holder, self.leader, age))


def source(holder: str, leader: Grant | None, age: float) -> str:
    """``summary from vm:1234:ab12 (leader), 4 s old``."""
    if leader is not None and leader.holder == holder:
        role = "leader"
    elif leader is not None:
        role = f"no longer leads; {leader.holder} leads now"
    else:
        role = "no reconciler leads now"
    return f"summary from {holder} ({role}), {age_words(age)} old"


def stale(holder: str, leader: Grant | None, age: float) -> str | None:
    """A sentence when the summary should not be taken as the fleet now; None when fresh."""
    if age > STALE_AFTER:
        return (f"Stale: this summary is {age_words(age)} old (the leader writes one every "
                f"{REFRESH:g} s). The figures below are the fleet as it was then"
                + ("; no reconciler leads now." if leader is None else "."))
    if leader is None or leader.holder != holder:
        return (f"{holder} no longer leads: this is its last summary; the new leader's "
                "follows within seconds." if leader is not None else
                f"No reconciler leads now: this is {holder}'s last summary.")
    return None


def age_words(seconds: float) -> str:
    """``4 s``, ``3 min``, ``2 h``: whole units, rounded down."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


__all__ = ["Publisher", "Reader", "Record", "decode", "document", "encode"]
