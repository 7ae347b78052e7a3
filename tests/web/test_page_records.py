"""The pages' records through the Store interface, on SQLite and a real PostgreSQL:
users and their password hashes, sessions, and the usage charts' sums.

Every test runs once per store (fixture ``store_settings``), so both answer alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import sessions, stores, usages, users
from llmgw.store.stores import Store
from llmgw.store.usages import UsageRow

NOW = 1_800_000_000.0


@pytest.fixture
async def store(store_settings: dict[str, str]) -> AsyncIterator[Store]:
    opened = await stores.open_store(StoreSettings.model_validate(store_settings))
    try:
        yield opened
    finally:
        await opened.close()


async def test_users_are_stored_with_argon2id_hashes_and_authenticate(store: Store) -> None:
    made = await users.create(store, "bob", "bob-user-pass", projects=["research", "a"],
                              now=NOW)
    assert made.projects == ("a", "research")
    stored = await store.password_hash("bob")
    assert stored is not None and stored.startswith("$argon2id$")
    assert "bob-user-pass" not in stored
    assert await users.authenticate(store, "bob", "bob-user-pass") == made
    assert await users.authenticate(store, "bob", "bob-user-pasS") is None
    assert await users.authenticate(store, "nobody", "bob-user-pass") is None
    with pytest.raises(users.UserError, match="already exists"):
        await users.create(store, "bob", "another-password")
    await users.create(store, "ada", "ada-admin-pass", admin=True, now=NOW + 1)
    assert [(u.name, u.admin) for u in await users.list_all(store)] == [
        ("ada", True), ("bob", False)]


async def test_a_sign_on_binds_a_row_to_its_subject_and_never_takes_over_a_name(
        store: Store) -> None:
    subject = "https://idp.example.com alice-sub"
    first = await users.sign_on(store, subject, "alice", admin=False, projects=["research"],
                                now=NOW)
    assert first == users.User("alice", False, ("research",), NOW, subject)
    assert await users.authenticate(store, "alice", "") is None, "no local password"
    # The next sign-on of the same subject updates its grants; the name and time stay.
    again = await users.sign_on(store, subject, "alice-renamed", admin=True, projects=[],
                                now=NOW + 5)
    assert again == users.User("alice", True, (), NOW, subject)
    assert await users.get(store, "alice") == again
    # A local account's name, or another subject's, is never taken over.
    await users.create(store, "bob", "bob-user-pass", now=NOW)
    assert await users.sign_on(store, "https://idp.example.com bob-sub", "bob", admin=True,
                               projects=[]) is None
    assert await users.sign_on(store, "https://other.example.com alice-sub", "alice",
                               admin=True, projects=[]) is None
    bob = await users.get(store, "bob")
    assert bob is not None and not bob.admin and bob.subject is None


async def test_a_sign_on_sets_the_project_admin_roles_its_groups_grant(store: Store) -> None:
    """``admin_of`` from the groups joins its projects, and is replaced at each sign-on: a
    group left at the provider takes the role away at the next one."""
    subject = "https://idp.example.com alice-sub"
    first = await users.sign_on(store, subject, "alice", admin=False, projects=["ops"],
                                admin_of=["research"], now=NOW)
    assert first == users.User("alice", False, ("ops", "research"), NOW, subject,
                               admin_of=("research",))
    assert first.role("research") == "admin" and first.role("ops") == "member"
    assert await users.get(store, "alice") == first
    again = await users.sign_on(store, subject, "alice", admin=False, projects=["research"],
                                now=NOW + 5)
    assert again == users.User("alice", False, ("research",), NOW, subject)
    assert again.role("research") == "member"
    assert await users.get(store, "alice") == again


async def test_a_single_sign_on_user_gets_no_local_password(store: Store) -> None:
    subject = "https://idp.example.com alice-sub"
    await users.sign_on(store, subject, "alice", admin=False, projects=[], now=NOW)
    with pytest.raises(users.UserError, match="single sign-on .https://idp.example.com."):
        await users.set_password(store, "alice", "a-local-password")
    assert await users.authenticate(store, "alice", "a-local-password") is None


async def test_a_new_password_or_deletion_ends_the_users_sessions(store: Store) -> None:
    await users.create(store, "bob", "bob-user-pass")
    first = await sessions.create(store, "bob", ttl=3600, now=NOW)
    assert await sessions.lookup(store, first.token, now=NOW + 1) == first.session
    assert await users.set_password(store, "bob", "a-new-password")
    assert await sessions.lookup(store, first.token, now=NOW + 1) is None
    assert await users.authenticate(store, "bob", "bob-user-pass") is None
    assert await users.authenticate(store, "bob", "a-new-password") is not None
    second = await sessions.create(store, "bob", ttl=3600, now=NOW)
    assert await users.delete(store, "bob")
    assert await sessions.lookup(store, second.token, now=NOW + 1) is None
    assert await users.get(store, "bob") is None
    assert not await users.delete(store, "bob")
    assert not await users.set_password(store, "bob", "a-new-password")


async def test_sessions_store_only_a_digest_and_expire(store: Store) -> None:
    created = await sessions.create(store, "bob", ttl=60, now=NOW)
    assert await store.session(created.token) is None  # the token itself is not a key
    assert await sessions.lookup(store, created.token, now=NOW + 59) == created.session
    assert await sessions.lookup(store, created.token, now=NOW + 60) is None
    assert await sessions.lookup(store, "short") is None
    kept = await sessions.create(store, "bob", ttl=600, now=NOW)
    assert await sessions.purge_expired(store, now=NOW + 61) == 1
    assert await store.session(created.session.digest) is None
    assert await sessions.lookup(store, kept.token, now=NOW + 61) == kept.session
    await sessions.delete(store, kept.token)
    assert await sessions.lookup(store, kept.token, now=NOW + 61) is None


def _row(ts: float, project: str | None, model: str, tokens: int, cost: float,
         user: str | None = None, key: str | None = None) -> UsageRow:
    return UsageRow(ts=ts, project=project, key_id=key, model=model,
                    endpoint="/v1/chat/completions", status=200, prompt_tokens=tokens,
                    completion_tokens=None, latency_ms=1.0, cost_usd=cost, user_name=user)


async def test_chart_series_and_user_totals_sum_the_same_on_both_stores(store: Store) -> None:
    step = 3600.0
    await usages.insert(store, [
        _row(NOW - 10, "research", "chat", 5, 0.5),          # before the window: left out
        _row(NOW + 10, "research", "chat", 3, 0.25, user="bob", key="k1"),
        _row(NOW + 3599.5, "research", "chat", 4, 0.25, key="k1"),
        _row(NOW + 3600, "research", "coder", 7, 1.0, user="bob"),
        _row(NOW + 7300, "other", "chat", 1, 2.0),
        _row(NOW + 7300, None, "chat", 1, 0.0),              # no project: not in "project"
    ])
    by_model = await usages.series(store, "model", NOW, step)
    assert [(b.start - NOW, b.group, b.requests, b.tokens, b.cost_usd) for b in by_model] == [
        (0.0, "chat", 2, 7, 0.5), (3600.0, "coder", 1, 7, 1.0), (7200.0, "chat", 2, 2, 2.0)]
    by_project = await usages.series(store, "project", NOW, step, ["research"])
    assert [(b.start - NOW, b.group, b.requests) for b in by_project] == [
        (0.0, "research", 2), (3600.0, "research", 1)]
    by_key = await usages.series(store, "key", NOW, step)
    assert [(b.group, b.requests) for b in by_key] == [("k1", 2)]
    assert await usages.series(store, "project", NOW, step, []) == []
    assert await usages.totals_for_user(store, "bob") == (2, 10, 1.25)
    assert await usages.totals_for_user(store, "cy") == (0, 0, 0.0)
