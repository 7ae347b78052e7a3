"""/account and /admin show what a project spent this period, the period and its reset.

A router with the pages over real HTTP on each store; the router's clock is the test's,
so the month turns when the test says.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest
from support.stacks import CPU, Stack

from llmgw.router import Settings
from llmgw.spec.models import Cluster
from llmgw.store import users
from llmgw.store.usages import UsageRow

PARIS = ZoneInfo("Europe/Paris")
JULY = dt.datetime(2026, 7, 1, tzinfo=PARIS).timestamp()
SPEC = Cluster.model_validate({
    "cluster": {"name": "lab", "auth": "keys"},
    "models": {"chat": {"profiles": CPU,
                        "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}},
    "projects": {"research": {"budget": {"usd": 2, "period": "month",
                                         "timezone": "Europe/Paris"}},
                 "ops": {"budget_usd": 5}},
})


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stack(tmp_path: Path, store_settings: dict[str, str]) -> Iterator[Stack]:
    made = Stack(tmp_path, SPEC, Settings(), 1, store_settings, pages=True)
    made.run(users.create(made.db, "bob", "bob-user-pass", projects=["research", "ops"]))
    made.run(users.create(made.db, "ada", "ada-user-pass", admin=True))
    try:
        yield made
    finally:
        made.close()


def row(ts: float, cost: float, project: str = "research") -> UsageRow:
    return UsageRow(ts=ts, project=project, key_id=None, model="chat", endpoint="/v1/x",
                    status=200, prompt_tokens=1, completion_tokens=1, latency_ms=1.0,
                    cost_usd=cost)


def budget_lines(client: httpx.Client, url: str) -> list[list[str]]:
    """The budgets table's rows as cell texts."""
    page = client.get(url)
    assert page.status_code == 200, page.text
    table = page.text[page.text.index("Spent this period"):]
    table = table[:table.index("</table>")]
    table = re.sub(r"<meter[^>]*>.*?</meter>", "", table)  # /admin's bar repeats the figure
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
            for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S) if "<td" in tr]


def login(client: httpx.Client, base: str, name: str, password: str) -> None:
    form = client.get(f"{base}/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token
    answer = client.post(f"{base}/login", data={"name": name, "password": password,
                                                "csrf": token.group(1)})
    assert answer.status_code == 303


def test_account_and_admin_show_this_periods_spend_and_its_reset(stack: Stack) -> None:
    clock = Clock(JULY - 3600)  # 30 June, 23:00 in Paris
    stack.router.accounts.clock = clock
    stack.run(stack.db.insert_usage([
        row(JULY - 40 * 86400, 1.5),  # May: not June's
        row(JULY - 86400, 0.25), row(JULY - 60, 0.5),  # June
        row(JULY - 86400, 1.0, project="ops")]))  # a lifetime budget counts all
    stack.run(stack.router.accounts.flush())
    june = [["ops", "$1.00", "$5.00", "20 %", "lifetime", "never"],
            ["research", "$0.75", "$2.00", "37 %", "month (Europe/Paris)",
             "2026-07-01 00:00 Europe/Paris"]]
    with httpx.Client(timeout=30) as bob, httpx.Client(timeout=30) as ada:
        login(bob, stack.url, "bob", "bob-user-pass")
        login(ada, stack.url, "ada", "ada-user-pass")
        assert budget_lines(bob, f"{stack.url}/account") == june
        assert budget_lines(ada, f"{stack.url}/admin") == june

        # Midnight in Paris: July starts empty, before and after the next flush alike.
        clock.now = JULY
        july = [june[0], ["research", "$0.00", "$2.00", "0 %", "month (Europe/Paris)",
                          "2026-08-01 00:00 Europe/Paris"]]
        assert budget_lines(bob, f"{stack.url}/account") == july
        stack.run(stack.db.insert_usage([row(JULY + 5, 0.125)]))
        stack.run(stack.router.accounts.flush())
        july[1][1:4] = ["$0.12", "$2.00", "6 %"]
        assert budget_lines(bob, f"{stack.url}/account") == july
        assert budget_lines(ada, f"{stack.url}/admin") == july
