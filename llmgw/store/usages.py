"""Usage rows: one per routed request, and spend per project.

A row holds who (project, key id), what (model, endpoint, status, stream),
how much (tokens in and out, cost in USD at the prices in force) and how long
(latency). It has no column for prompt or completion text, so no code path
can store one.

Usage::

    await usages.insert(store, [UsageRow(...)])
    await usages.spend_by_project(store)   # {"research": 12.5}

:func:`series` and :func:`totals_for_user` feed the pages' charts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llmgw.store.stores import Store


@dataclass(frozen=True)
class UsageRow:
    ts: float
    project: str | None
    key_id: str | None
    model: str
    endpoint: str
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float
    cost_usd: float = 0.0
    stream: bool = False
    user_name: str | None = None  # the logged-in person, for requests from /chat
    upstream: str | None = None  # the upstream (``upstreams:``) that served it; None: a replica
    # The router's id of the request (migration 19): a row buffered on a router's disk
    # during a store outage and written again on recovery is written once.
    request_id: str | None = None


COLUMNS: tuple[str, ...] = tuple(UsageRow.__dataclass_fields__)

Record = tuple[float, str | None, str | None, str, str, int, int | None, int | None, float,
               float, bool, str | None, str | None, str | None]


def to_record(r: UsageRow) -> Record:
    # Field by field, not dataclasses.astuple: that deep-copies every value, which
    # costs more than the insert itself.
    return (r.ts, r.project, r.key_id, r.model, r.endpoint, r.status, r.prompt_tokens,
            r.completion_tokens, r.latency_ms, r.cost_usd, r.stream, r.user_name, r.upstream,
            r.request_id)


def from_record(values: Sequence[Any]) -> UsageRow:
    """A row from its columns in :data:`COLUMNS` order (SQLite's stream is 0/1)."""
    fields = dict(zip(COLUMNS, values, strict=True))
    fields["stream"] = bool(fields["stream"])
    return UsageRow(**fields)


async def insert(store: Store, rows: Sequence[UsageRow]) -> None:
    """Append ``rows`` in one transaction (one fsync at most, not one per row)."""
    await store.insert_usage(rows)


async def spend_by_project(store: Store) -> dict[str, float]:
    """USD charged so far to each project."""
    return await store.spend_by_project()


async def last_use_by_model(store: Store) -> dict[str, float]:
    """Unix time of each model's last recorded request (by model key)."""
    return await store.last_use_by_model()


async def recent(store: Store, limit: int = 100) -> list[UsageRow]:
    """The newest ``limit`` rows, newest first."""
    return await store.recent_usage(limit)


@dataclass(frozen=True)
class Bucket:
    """Requests, tokens and spend of one group (project, key or model) in one time slot."""

    start: float
    group: str
    requests: int
    tokens: int
    cost_usd: float


GROUPS = {"project": "project", "key": "key_id", "model": "model"}  # chart group → column


async def series(
    store: Store, by: Literal["project", "key", "model"], since: float, step: float,
    projects: Sequence[str] | None = None,
) -> list[Bucket]:
    """Usage since ``since`` in slots of ``step`` seconds, grouped ``by`` project, key or
    model; only rows of ``projects`` when given. Rows without the group are left out."""
    return await store.usage_series(by, since, step, projects)


async def totals_for_user(store: Store, user: str) -> tuple[int, int, float]:
    """(requests, tokens, USD) of the requests ``user`` made from the pages."""
    return await store.user_totals(user)
