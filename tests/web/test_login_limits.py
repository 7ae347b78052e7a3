"""Login limits: no stranger can lock an account out; backoff is per source; bounded; audited.

The rules are driven directly (10,000 failures take milliseconds there); what a
client sees goes through the real login endpoint of a router with the pages,
behind a "proxy" (the test itself, from 127.0.0.1, which the cluster trusts)
that says which address each request came from in X-Forwarded-For.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.stacks import Stack, cluster

from llmgw.router import Settings
from llmgw.spec.models import Cluster
from llmgw.store import users
from llmgw.web import throttles
from llmgw.web.throttles import Limiter, Rules

ATTACKER, OWNER = "203.0.113.7", "198.51.100.9"


def spec(trusted: list[str]) -> Cluster:
    data = cluster(research=None).model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["cluster"]["web"] = {"trusted_proxies": trusted}
    return Cluster.model_validate(data)


def stack_for(tmp: Path, trusted: list[str]) -> Stack:
    made = Stack(tmp, spec(trusted), Settings(), 1, pages=True)
    made.route({"chat": made.upstreams})
    made.run(users.create(made.db, "bob", "bob-user-pass", projects=["research"]))
    # A first backoff of 5 minutes: a held-back attempt stays held however slow the host.
    made.pages.gate.limiter.rules = Rules(base=300)
    return made


@pytest.fixture
def behind_proxy(tmp_path: Path) -> Iterator[Stack]:
    made = stack_for(tmp_path, ["127.0.0.1"])
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def direct(tmp_path: Path) -> Iterator[Stack]:
    made = stack_for(tmp_path, [])
    try:
        yield made
    finally:
        made.close()


def login(base: str, name: str, password: str, forwarded: str | None = None,
          **fields: str) -> httpx.Response:
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    with httpx.Client(timeout=30, headers=headers) as client:
        form = client.get(f"{base}/login").text
        token = re.search(r'name="csrf" value="([^"]+)"', form)
        assert token
        return client.post(f"{base}/login", data={"name": name, "password": password,
                                                  "csrf": token.group(1), **fields})


def test_ten_wrong_passwords_from_a_stranger_do_not_lock_the_owner_out(
    behind_proxy: Stack,
) -> None:
    codes = [login(behind_proxy.url, "bob", "wrong-guess", ATTACKER).status_code
             for _ in range(10)]
    owner = login(behind_proxy.url, "bob", "bob-user-pass", OWNER)
    assert owner.status_code == 303, owner.text
    assert "llmgw_session=" in owner.headers["set-cookie"]
    assert codes == [401] * 5 + [429] * 5, "the stranger's own address is held back"


def test_ten_thousand_failures_from_one_address_and_the_owner_still_logs_in(
    behind_proxy: Stack,
) -> None:
    limiter = behind_proxy.pages.gate.limiter
    for _ in range(10_000):
        limiter.failed(ATTACKER, "bob", known=True)
    assert limiter.under_attack("bob") and limiter.failures(ATTACKER) == 10_000
    assert len(limiter.sources) == 1 and len(limiter.accounts) == 1  # one record each
    # The attacker's address is held back, the right password included, and told how long.
    held = login(behind_proxy.url, "bob", "bob-user-pass", ATTACKER)
    assert held.status_code == 429 and 0 < int(held.headers["retry-after"]) <= 900
    assert "llmgw_session=" not in held.headers.get("set-cookie", "")
    # The owner, from an address without failures, logs in at once.
    owner = login(behind_proxy.url, "bob", "bob-user-pass", OWNER)
    assert owner.status_code == 303 and owner.headers["location"] == "/chat", owner.text
    # A wrong password from a fresh address is checked; while the account is under attack
    # that address gets no free tries: its next attempt must wait.
    other = "192.0.2.44"
    assert login(behind_proxy.url, "bob", "wrong-guess", other).status_code == 401
    assert login(behind_proxy.url, "bob", "bob-user-pass", other).status_code == 429


def test_x_forwarded_for_is_ignored_from_an_untrusted_peer(direct: Stack) -> None:
    codes = [login(direct.url, "bob", "wrong-guess", f"10.9.8.{i}").status_code
             for i in range(8)]
    assert codes == [401] * 5 + [429] * 3, codes
    assert list(direct.pages.gate.limiter.sources) == ["127.0.0.1"]


@pytest.mark.parametrize(
    ("forwarded", "source"),
    [
        pytest.param("203.0.113.7", "203.0.113.7", id="the-client"),
        pytest.param("6.6.6.6, 203.0.113.7", "203.0.113.7", id="forged-hops-left-ignored"),
        pytest.param("203.0.113.7, 127.0.0.9", "203.0.113.7", id="through-a-second-proxy"),
        pytest.param("not-an-address", "127.0.0.1", id="garbage-is-not-believed"),
        pytest.param("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64", id="ipv6-by-its-64"),
    ],
)
def test_failures_are_audited_with_the_source_and_never_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, forwarded: str, source: str,
) -> None:
    made = stack_for(tmp_path, ["127.0.0.0/8"])
    try:
        with caplog.at_level(logging.INFO, logger="llmgw.audit"):
            login(made.url, "bob", "secret-guess-1", forwarded)
            login(made.url, "<Bob>\r\nforged", "secret-guess-2", forwarded)
    finally:
        made.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "llmgw.audit"]
    assert lines == [
        f"login failed: method=password account=bob reason=password source={source} "
        "known=yes source_failures=1 account_under_attack=no next_wait=0s",
        f"login failed: method=password account=? reason=password source={source} "
        "known=no source_failures=2 account_under_attack=no next_wait=0s",
    ]
    assert "secret-guess" not in caplog.text and "forged" not in caplog.text


def test_strangers_rotating_names_and_addresses_cannot_grow_the_limiter() -> None:
    now = [1000.0]
    limiter = Limiter(Rules(max_keys=500), clock=lambda: now[0])
    for i in range(5_000):
        limiter.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", f"name{i}", known=False)
        limiter.failed("203.0.113.7", "bob", known=True)
        now[0] += 0.01
    assert len(limiter.sources) == 500 and len(limiter.accounts) == 1
    assert limiter.failures("203.0.113.7") == 5_000, "the busiest source is kept"
    now[0] += 3601
    limiter.failed("192.0.2.1", "bob", known=True)
    assert list(limiter.sources) == ["192.0.2.1"], "forgotten records are dropped"


# Each row: failures as (source, account) pairs, then who asks, and whether they must wait.
A, B = "203.0.113.7", "198.51.100.9"
RULES = Rules(free=2, base=10, cap=40, forget=100, alarm=3)


@pytest.mark.parametrize(
    ("failures", "later", "source", "account", "waits"),
    [
        pytest.param([], 0, A, "bob", 0, id="nothing-failed"),
        pytest.param([(A, "bob")], 0, A, "bob", 0, id="within-the-free-tries"),
        pytest.param([(A, "bob")] * 2, 0, A, "bob", 10, id="backoff-starts"),
        pytest.param([(A, "x")] * 2, 0, A, "bob", 10, id="backoff-counts-every-name"),
        pytest.param([(A, "x")] * 3, 0, A, "x", 20, id="backoff-doubles"),
        pytest.param([(A, "x")] * 30, 0, A, "x", 40, id="backoff-is-capped"),
        pytest.param([(A, "x")] * 3, 25, A, "x", 0, id="backoff-passes"),
        pytest.param([(A, "bob")] * 30, 0, B, "bob", 0, id="a-clean-source-is-never-held"),
        pytest.param([(A, "bob")] * 3 + [(B, "bob")], 0, B, "bob", 10,
                     id="under-attack-no-free-tries"),
        pytest.param([(A, "bob")] * 3 + [(B, "bob")], 0, B, "cy", 0,
                     id="free-tries-kept-for-other-accounts"),
        pytest.param([(A, "x")] * 30, 101, A, "x", 0, id="forgotten-after-forget"),
    ],
)
def test_the_rules(failures: list[tuple[str, str]], later: float, source: str,
                   account: str, waits: int) -> None:
    now = [0.0]
    limiter = Limiter(RULES, clock=lambda: now[0])
    for who, name in failures:
        limiter.failed(who, name, known=name != "x")
    now[0] += later
    assert limiter.retry_after(source, account) == waits


@pytest.mark.parametrize(
    ("address", "source"),
    [
        ("192.0.2.1", "192.0.2.1"),
        ("2001:db8::1", "2001:db8::/64"),
        ("2001:db8::ffff:1", "2001:db8::/64"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("/run/llmgw.sock", "?"),
        ("", "?"),
    ],
)
def test_sources_are_addresses_and_ipv6_counts_by_its_64(address: str, source: str) -> None:
    assert throttles.source_of(address) == source
