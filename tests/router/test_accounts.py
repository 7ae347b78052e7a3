"""Accounts on a real SQLite store, without the HTTP stack around it.

The stack tests (test_router_access, test_router_budgets, test_router_limits)
show these rules from a client's side; these show each one closely and fast:
the Bearer scheme and nothing else, the exact errors (status, code, type,
message), the budget at its boundary, what is buffered and when it is
written, a failed write kept and retried once, and the background flusher.
A store that fails is a real one with a table renamed away under it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from llmgw.router import accounts as accounts_module
from llmgw.router.accounts import ANONYMOUS, NOTHING, Accounts, Principal, Reservation
from llmgw.router.catalogs import Catalog
from llmgw.router.errors import ApiError
from llmgw.store import keys, usages
from llmgw.store.sqlitestores import SQLiteStore
from llmgw.store.usages import UsageRow

HOW_TO = "send `Authorization: Bearer <key>`; an operator creates keys with `llmgw keys create`"
BUDGETS: dict[str, float | None] = {"research": None, "capped": 1.0, "broke": 0.0,
                                    "tiny": 0.00001, "cent": 0.01, "big": 1234.5}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = await SQLiteStore.open(tmp_path / "llmgw.db")
    yield opened
    await opened.close()


@pytest.fixture
async def accounts(store: SQLiteStore) -> AsyncIterator[Accounts]:
    made = Accounts(store, Catalog(budgets=BUDGETS), flush_interval=0.01)
    yield made
    await made.close()


@contextmanager
def table_gone(store: SQLiteStore, table: str) -> Iterator[None]:
    """The store fails on ``table`` (renamed away by another connection) until the end."""
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    try:
        yield
    finally:
        other.execute(f"ALTER TABLE {table}_away RENAME TO {table}")
        other.close()


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name in ("llmgw.router.accounts", "llmgw.router.keycaches")]


def unreachable(store: SQLiteStore, table: str) -> str:
    """The one line logged when the store goes away (llmgw.router.keycaches)."""
    return ("the store is unreachable; known keys keep working on this router's cache and "
            f"local ledger, usage rows are buffered: {store.where}: no such table: {table}")


def row(project: str | None, cost: float, status: int = 200) -> UsageRow:
    return UsageRow(ts=1.0, project=project, key_id=None, model="chat", endpoint="chat",
                    status=status, prompt_tokens=1, completion_tokens=1, latency_ms=1.0,
                    cost_usd=cost)


async def refused(call: asyncio.Future[object] | object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await call  # type: ignore[misc]
    return caught.value


def shape(error: ApiError) -> tuple[int, str | None, str, str, dict[str, str]]:
    return error.status, error.code, error.type, error.message, error.headers


# -- who is asking --------------------------------------------------------------------------

def test_keys_need_a_store() -> None:
    with pytest.raises(ValueError, match="^auth: keys needs a store to check keys against$"):
        Accounts(None, Catalog())
    Accounts(None, Catalog(auth="none"))  # nothing to check keys against, none needed


async def test_auth_none_asks_nothing(store: SQLiteStore) -> None:
    open_door = Accounts(store, Catalog(auth="none"))
    assert await open_door.authenticate(None) == ANONYMOUS
    assert await open_door.authenticate("Basic anything") == ANONYMOUS


async def test_a_bearer_key_is_its_project(accounts: Accounts, store: SQLiteStore) -> None:
    created = await keys.create(store, "research")
    expected = Principal("research", created.info.id)
    assert await accounts.authenticate(f"Bearer {created.secret}") == expected
    # The scheme is case-insensitive (RFC 9110); the key is taken without spaces around it.
    assert await accounts.authenticate(f"bearer  {created.secret} ") == expected


@pytest.mark.parametrize("header", [None, ""])
async def test_no_key(accounts: Accounts, header: str | None) -> None:
    assert shape(await refused(accounts.authenticate(header))) == (
        401, "missing_api_key", "authentication_error", f"missing API key: {HOW_TO}", {})


@pytest.mark.parametrize("scheme", ["Basic {key}", "Token {key}", "{key}", "Bearer", "Bearer   ",
                                    "Bearer:{key}"])
async def test_only_the_bearer_scheme_carries_a_key(
        accounts: Accounts, store: SQLiteStore, scheme: str) -> None:
    """A valid key sent any other way is refused: it was meant for something else."""
    created = await keys.create(store, "research")
    error = await refused(accounts.authenticate(scheme.format(key=created.secret)))
    assert shape(error) == (401, "invalid_api_key", "authentication_error",
                            f"malformed Authorization header: {HOW_TO}", {})


async def test_unknown_and_revoked_keys(accounts: Accounts, store: SQLiteStore) -> None:
    created = await keys.create(store, "research")
    await keys.revoke(store, created.info.id)
    for key in (created.secret, "sk-not-ours"):
        assert shape(await refused(accounts.authenticate(f"Bearer {key}"))) == (
            401, "invalid_api_key", "authentication_error",
            "invalid API key (unknown, mistyped or revoked)", {})


async def test_a_key_of_a_project_gone_from_the_spec(
        accounts: Accounts, store: SQLiteStore) -> None:
    created = await keys.create(store, "old-project")
    assert shape(await refused(accounts.authenticate(f"Bearer {created.secret}"))) == (
        403, "unknown_project", "permission_error",
        "this key's project 'old-project' is not defined in the cluster's projects", {})


async def test_an_unreachable_key_store_is_503(
        accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    created = await keys.create(store, "research")
    with table_gone(store, "keys"):
        error = await refused(accounts.authenticate(f"Bearer {created.secret}"))
    # not a key this router knows (never used here): 503, not 401; one line logged
    assert shape(error) == (503, "store_unavailable", "server_error",
                            "the key store is unreachable and this key is not one this router "
                            "knows; retry shortly", {"Retry-After": "2"})
    assert logged(caplog) == [unreachable(store, "keys")]
    assert created.secret not in caplog.text


async def test_a_known_key_works_while_the_key_store_is_away(
        accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    created = await keys.create(store, "research")
    expected = Principal("research", created.info.id)
    assert await accounts.authenticate(f"Bearer {created.secret}") == expected  # cached now
    with table_gone(store, "keys"):
        assert await accounts.authenticate(f"Bearer {created.secret}") == expected
        # the cache holds the digest, not the key: a wrong secret of the same id is a 401
        wrong = created.secret[:-4] + ("AAAA" if not created.secret.endswith("AAAA") else "BBBB")
        assert (await refused(accounts.authenticate(f"Bearer {wrong}"))).status == 401
    assert logged(caplog) == []  # nothing asked the store


# -- budgets --------------------------------------------------------------------------------

async def test_nothing_is_reserved_without_a_budget(store: SQLiteStore) -> None:
    accounts = Accounts(store, Catalog(budgets=BUDGETS))
    assert await accounts.reserve(Principal("research", "k"), 5.0) == NOTHING
    assert await accounts.reserve(ANONYMOUS, 5.0) == NOTHING
    assert await accounts.reserve(Principal("unlisted", "k"), 5.0) == NOTHING
    assert await Accounts(None, Catalog(budgets=BUDGETS, auth="none")).reserve(
        Principal("capped", None), 5.0) == NOTHING


def over(project: str, spent: str, budget: str, in_flight: str = "") -> tuple[
        int, str, str, str, dict[str, str]]:
    held = f" (requests in flight hold {in_flight} more)" if in_flight else ""
    return (429, "insufficient_quota", "insufficient_quota",
            f"project {project!r} is over its budget: spent {spent} of {budget}{held}; raise "
            "budget_usd in the cluster's projects to continue", {})


async def test_requests_in_flight_hold_the_budget(accounts: Accounts) -> None:
    caller = Principal("capped", "k")
    held = [await accounts.reserve(caller, 0.4) for _ in range(3)]  # 0, 0.4, 0.8 < 1.0
    assert [(r.project, r.amount) for r in held] == [("capped", 0.4)] * 3
    assert len({r.id for r in held}) == 3 and None not in {r.id for r in held}
    assert shape(await refused(accounts.reserve(caller, 0.4))) == over(
        "capped", "$0.00", "$1.00", "$1.20")


async def test_the_refusal_counts_what_is_in_flight(accounts: Accounts) -> None:
    caller = Principal("capped", "k")
    await accounts.reserve(caller, 0.4)
    accounts.record(row("capped", 0.75))
    await accounts.flush()
    assert shape(await refused(accounts.reserve(caller, 0.1))) == over(
        "capped", "$0.75", "$1.00", "$0.40")


async def test_a_budget_of_zero_admits_nothing(accounts: Accounts) -> None:
    assert shape(await refused(accounts.reserve(Principal("broke", "k"), 0.0))) == over(
        "broke", "$0.00", "$0.00")


@pytest.mark.parametrize(("project", "spend", "spent", "budget"), [
    ("tiny", 0.000014, "$0.000014", "$0.000010"),  # below a cent: to the micro-dollar
    ("cent", 0.01, "$0.01", "$0.01"),  # spent == budget: refused, cents from one cent up
    ("big", 2000.0, "$2,000.00", "$1,234.50"),
])
async def test_spend_at_or_over_the_budget_is_refused(
        accounts: Accounts, project: str, spend: float, spent: str, budget: str) -> None:
    accounts.record(row(project, spend))
    await accounts.flush()
    assert shape(await refused(accounts.reserve(Principal(project, "k"), 0.0))) == over(
        project, spent, budget)


async def test_an_unreachable_budget_store_admits_on_the_local_ledger(
        accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    caller = Principal("capped", "k")
    before = await accounts.reserve(caller, 0.3)  # in the store, before the outage
    assert before.id is not None and not before.local
    with table_gone(store, "reservations"):
        held = [await accounts.reserve(caller, 0.3) for _ in range(3)]  # 0.3, 0.6, 0.9 < 1
        assert [(r.project, r.amount, r.id, r.local) for r in held] == [
            ("capped", 0.3, None, True)] * 3
        # As the store would: what this router holds in flight, in the store or here.
        assert shape(await refused(accounts.reserve(caller, 0.3))) == over(
            "capped", "$0.00", "$1.00", "$1.20")
        for done in held[:2]:  # each cost 0.1: charged, and its estimate given back
            accounts.record(row("capped", 0.1), done)
            await accounts.settle(done, 0.1)
        assert (await accounts.reserve(caller, 0.3)).local  # 0.2 spent + 0.6 held < 1
        assert shape(await refused(accounts.reserve(caller, 0.3))) == over(
            "capped", "$0.20", "$1.00", "$0.90")
    assert logged(caplog) == [unreachable(store, "reservations")]  # one line, not six
    await accounts.flush()  # the store is back: reservations are the store's again
    assert (await accounts.reserve(caller, 0.05)).id is not None


async def test_settling_shrinks_a_reservation_to_its_cost(
        accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    caller = Principal("capped", "k")
    first = await accounts.reserve(caller, 0.4)
    await accounts.reserve(caller, 0.4)
    await accounts.settle(first, 0.1)
    assert (await store.reserve("capped", 1.0, 0.0, 60)).reserved == pytest.approx(0.5)
    await accounts.settle(NOTHING, 0.0)  # nothing reserved, nothing to settle
    await Accounts(None, Catalog(auth="none")).settle(first, 0.0)  # no store, nothing held
    with table_gone(store, "reservations"):
        await accounts.settle(first, 0.0)  # the estimate holds: the safe side
    assert logged(caplog) == [unreachable(store, "reservations")]
    assert (await store.reserve("capped", 1.0, 0.0, 60)).reserved == pytest.approx(0.5)


@pytest.mark.parametrize(("payload", "tokens"), [
    ({"max_tokens": 0}, 0),  # a limit of zero is a limit
    ({"max_tokens": -1}, accounts_module.DEFAULT_OUTPUT_TOKENS),
    ({"max_tokens": 7, "n": 0}, 7),  # no choices asked: one
    ({"max_tokens": 7, "n": 1}, 7),
    ({"max_tokens": 7, "n": 2}, 14),
])
def test_estimate_edges(payload: dict[str, object], tokens: int) -> None:
    assert accounts_module.estimate(10, payload, False) == (10, tokens)


# -- usage rows -----------------------------------------------------------------------------

async def test_spend_is_charged_at_once_and_written_at_the_flush(
        accounts: Accounts, store: SQLiteStore) -> None:
    for project, cost in (("research", 0.25), ("research", 0.5), (None, 1.0), ("capped", 0.0)):
        accounts.record(row(project, cost))
    assert accounts.spent == {"research": 0.75}
    assert await usages.recent(store) == []
    await accounts.flush()
    assert len(await usages.recent(store)) == 4
    assert await usages.spend_by_project(store) == {"research": 0.75}


async def test_a_flush_settles_the_reservations_of_its_rows(
        accounts: Accounts, store: SQLiteStore) -> None:
    caller = Principal("capped", "k")
    held = await accounts.reserve(caller, 0.4)
    accounts.record(row("capped", 0.3), held)
    accounts.record(row("capped", 0.1), NOTHING)
    accounts.record(row("capped", 0.1), Reservation("capped", 0.1, None))
    await accounts.flush()
    admission = await store.reserve("capped", 1.0, 0.0, 60)
    assert admission.reserved == 0 and admission.spent == pytest.approx(0.5)


async def test_spend_of_other_routers_counts_after_a_flush(
        accounts: Accounts, store: SQLiteStore) -> None:
    other = Accounts(store, Catalog(budgets=BUDGETS))
    other.record(row("capped", 0.75))
    await other.flush()
    accounts.record(row("research", 0.5))
    await accounts.flush()
    assert accounts.spent == {"capped": 0.75, "research": 0.5}


async def test_a_failed_write_is_kept_and_written_once_later(
        accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    caller = Principal("capped", "k")
    held = await accounts.reserve(caller, 0.4)
    accounts.record(row("capped", 0.25), held)
    with table_gone(store, "usage"):
        await accounts.flush()
        assert logged(caplog) == [unreachable(store, "usage")]
        accounts.record(row("capped", 0.5))
    assert accounts.spent == {"capped": 0.75}  # still charged while unwritten
    # The failed row's reservation still holds the budget meanwhile.
    assert (await store.reserve("capped", 1.0, 0.0, 60)).reserved == pytest.approx(0.4)
    await accounts.flush()
    assert [r.cost_usd for r in await usages.recent(store)] == [0.5, 0.25]  # newest first
    assert (await store.reserve("capped", 1.0, 0.0, 60)).reserved == 0
    await accounts.flush()
    assert len(await usages.recent(store)) == 2
    assert accounts.spent == {"capped": 0.75}


async def test_rows_recorded_during_a_failed_write_are_kept_too(
        accounts: Accounts, store: SQLiteStore) -> None:
    caller = Principal("capped", "k")
    first, second = await accounts.reserve(caller, 0.3), await accounts.reserve(caller, 0.3)
    accounts.record(row("capped", 0.25), first)
    with table_gone(store, "usage"):
        flushing = asyncio.create_task(accounts.flush())
        await asyncio.sleep(0)  # the flush has taken the rows and awaits the store
        accounts.record(row("capped", 0.5), second)
        await flushing
    await accounts.flush()
    assert sorted(r.cost_usd for r in await usages.recent(store)) == [0.25, 0.5]
    assert (await store.reserve("capped", 1.0, 0.0, 60)).reserved == 0


async def test_a_failed_spend_reload_keeps_the_rows_too(
        accounts: Accounts, store: SQLiteStore) -> None:
    accounts.record(row("capped", 0.25))
    with table_gone(store, "project_spend"):
        await accounts.flush()
    await accounts.flush()
    assert [r.cost_usd for r in await usages.recent(store)] == [0.25]


async def test_rows_recorded_during_a_flush_stay_charged(
        accounts: Accounts, store: SQLiteStore) -> None:
    accounts.record(row("capped", 0.25))
    flushing = asyncio.create_task(accounts.flush())
    await asyncio.sleep(0)  # the flush has taken the rows and awaits the store
    for project, cost in (("capped", 0.5), ("new", 0.125), ("new", 0.25), (None, 1.0),
                          ("free", 0.0)):
        accounts.record(row(project, cost))
    await flushing
    # Stored spend plus what is still only in memory; nothing for no project or no cost.
    assert accounts.spent == {"capped": 0.75, "new": 0.375}
    assert [r.cost_usd for r in await usages.recent(store)] == [0.25]


async def test_without_a_store_nothing_is_buffered() -> None:
    accounts = Accounts(None, Catalog(auth="none"))
    accounts.record(row("research", 0.5), Reservation("research", 0.5, "r1"))
    await accounts.flush()
    await accounts.start()
    await accounts.close()
    assert accounts.spent == {"research": 0.5}


# -- the background flusher -----------------------------------------------------------------

async def until_written(store: SQLiteStore, count: int) -> None:
    while len(await usages.recent(store)) < count:
        await asyncio.sleep(0.01)


async def test_start_loads_spend_and_flushes_in_the_background(
        accounts: Accounts, store: SQLiteStore) -> None:
    other = Accounts(store, Catalog(budgets=BUDGETS))
    other.record(row("capped", 0.75))
    await other.flush()
    await accounts.start()
    assert accounts.spent == {"capped": 0.75}
    flusher = accounts._flusher
    await accounts.start()  # once only
    assert accounts._flusher is flusher
    accounts.record(row("capped", 0.25))
    await asyncio.wait_for(until_written(store, 2), timeout=60)  # no flush() called here
    accounts.record(row("capped", 0.5))
    await asyncio.wait_for(until_written(store, 3), timeout=60)  # and it keeps flushing


async def test_start_on_a_failing_store_still_flushes_later(
        accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    with table_gone(store, "project_spend"):
        await accounts.start()
    assert logged(caplog) == [
        f"cannot load spend from the store yet: {store.where}: no such table: project_spend"]
    accounts.record(row("capped", 0.25))
    await asyncio.wait_for(until_written(store, 1), timeout=60)


async def test_close_writes_what_is_left(store: SQLiteStore) -> None:
    accounts = Accounts(store, Catalog(budgets=BUDGETS), flush_interval=3600)
    await accounts.start()
    accounts.record(row("capped", 0.25))
    await accounts.close()
    assert accounts._flusher is None
    assert [r.cost_usd for r in await usages.recent(store)] == [0.25]


@pytest.fixture(autouse=True)
def _errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.router.accounts")
