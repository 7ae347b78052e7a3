"""Budget periods: where each starts and resets, in a time zone, the clock an argument.

Cases as data: (period, time zone, an instant as local wall-clock text) → the period's
start and next reset as local wall-clock text. DST days and month ends included.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from llmgw.spec import budgets, loading
from llmgw.spec.budgets import Period
from llmgw.spec.loading import SpecErrors


def at(text: str, zone: str) -> float:
    """Unix time of local ``YYYY-MM-DD HH:MM[:SS]`` in ``zone`` (fold 0)."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=budgets.zone(zone)).timestamp()


def local(ts: float, zone: str) -> str:
    return dt.datetime.fromtimestamp(ts, budgets.zone(zone)).isoformat()


CASES = [
    # kind, zone, now, start, resets
    ("day", "UTC", "2026-03-14 15:09", "2026-03-14T00:00:00+00:00", "2026-03-15T00:00:00+00:00"),
    ("day", "UTC", "2026-03-14 00:00", "2026-03-14T00:00:00+00:00", "2026-03-15T00:00:00+00:00"),
    ("day", "UTC", "2026-03-14 23:59:59.999", "2026-03-14T00:00:00+00:00",
     "2026-03-15T00:00:00+00:00"),
    # Paris springs forward on 2026-03-29 (a 23-hour day) and falls back on 2026-10-25 (25 h).
    ("day", "Europe/Paris", "2026-03-29 12:00", "2026-03-29T00:00:00+01:00",
     "2026-03-30T00:00:00+02:00"),
    ("day", "Europe/Paris", "2026-10-25 23:30", "2026-10-25T00:00:00+02:00",
     "2026-10-26T00:00:00+01:00"),
    # New York: 01:30 on 2026-11-01 happens twice; both are that day.
    ("day", "America/New_York", "2026-11-01 01:30", "2026-11-01T00:00:00-04:00",
     "2026-11-02T00:00:00-05:00"),
    # Weeks start on Monday; 2026-03-15 is a Sunday, 2026-03-16 a Monday.
    ("week", "UTC", "2026-03-15 23:00", "2026-03-09T00:00:00+00:00", "2026-03-16T00:00:00+00:00"),
    ("week", "UTC", "2026-03-16 00:00", "2026-03-16T00:00:00+00:00", "2026-03-23T00:00:00+00:00"),
    ("week", "Europe/Paris", "2026-03-29 20:00", "2026-03-23T00:00:00+01:00",
     "2026-03-30T00:00:00+02:00"),
    # Month ends: 31, 30, 28 and 29 days, and the year's end.
    ("month", "UTC", "2026-01-31 23:59", "2026-01-01T00:00:00+00:00", "2026-02-01T00:00:00+00:00"),
    ("month", "UTC", "2026-04-30 12:00", "2026-04-01T00:00:00+00:00", "2026-05-01T00:00:00+00:00"),
    ("month", "UTC", "2026-02-28 12:00", "2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00"),
    ("month", "UTC", "2028-02-29 12:00", "2028-02-01T00:00:00+00:00", "2028-03-01T00:00:00+00:00"),
    ("month", "UTC", "2026-12-31 23:00", "2026-12-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00"),
    ("month", "Europe/Paris", "2026-10-31 23:30", "2026-10-01T00:00:00+02:00",
     "2026-11-01T00:00:00+01:00"),
    # Sao Paulo's clocks jumped from 00:00 to 01:00 on 2018-11-04: that day began at 01:00.
    ("day", "America/Sao_Paulo", "2018-11-04 12:00", "2018-11-04T01:00:00-02:00",
     "2018-11-05T00:00:00-02:00"),
    # A time zone ahead of UTC by 5:45: the day starts at 18:15 UTC the day before.
    ("day", "Asia/Kathmandu", "2026-03-14 00:10", "2026-03-14T00:00:00+05:45",
     "2026-03-15T00:00:00+05:45"),
]


@pytest.mark.parametrize(("kind", "zone", "now", "start", "resets"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_a_period_starts_and_resets_on_its_calendar_boundary(
        kind: budgets.PeriodKind, zone: str, now: str, start: str, resets: str) -> None:
    period = Period(kind, zone)
    when = at(now, zone)
    began, ends = period.start(when), period.resets(when)
    assert began is not None and ends is not None
    assert (local(began, zone), local(ends, zone)) == (start, resets)
    # The reset is exact: the instant of the reset is in the next period, the one before not.
    assert period.start(ends) == ends
    assert period.start(ends - 1e-6) == began


def test_the_dst_days_last_23_and_25_hours() -> None:
    paris = Period("day", "Europe/Paris")
    spring, autumn = at("2026-03-29 12:00", "Europe/Paris"), at("2026-10-25 12:00", "Europe/Paris")
    assert paris.resets(spring) - paris.start(spring) == 23 * 3600  # type: ignore[operator]
    assert paris.resets(autumn) - paris.start(autumn) == 25 * 3600  # type: ignore[operator]


def test_a_lifetime_budget_has_no_period() -> None:
    assert budgets.LIFETIME.start(1e9) is None and budgets.LIFETIME.resets(1e9) is None
    assert budgets.LIFETIME.describe() == "lifetime"
    assert Period("month", "Europe/Paris").describe() == "month (Europe/Paris)"


def spec(tmp_path: Path, project: str) -> Path:
    (tmp_path / "cluster.yaml").write_text(
        "cluster: {name: lab}\nprojects:\n  research: " + project + "\n")
    return tmp_path


def test_the_budget_forms_load_into_a_limit_and_a_period(tmp_path: Path) -> None:
    cluster = loading.load(spec(tmp_path, "{budget: {usd: 100, period: week, "
                                    "timezone: Europe/Paris}}"))
    assert cluster.projects["research"].limit() == (100.0, Period("week", "Europe/Paris"))
    cluster = loading.load(spec(tmp_path, "{budget_usd: 50}"))
    assert cluster.projects["research"].limit() == (50.0, budgets.LIFETIME)
    cluster = loading.load(spec(tmp_path, "{budget: {usd: 10}}"))
    assert cluster.projects["research"].limit() == (10.0, Period("none", "UTC"))


@pytest.mark.parametrize(("project", "says"), [
    ("{budget: {usd: 1, period: month, timezone: Mars/Olympus}}", "unknown time zone"),
    ("{budget: {usd: 1, period: month, timezone: ../../etc/passwd}}", "unknown time zone"),
    ("{budget: {usd: 1, period: fortnight}}", "period"),
    ("{budget_usd: 5, budget: {usd: 1, period: day}}", "not both"),
])
def test_a_bad_budget_is_a_located_error(tmp_path: Path, project: str, says: str) -> None:
    with pytest.raises(SpecErrors) as caught:
        loading.load(spec(tmp_path, project))
    text = str(caught.value)
    assert "cluster.yaml:3:" in text and says in text, text


MODEL = "  chat:\n    source: /srv/m.gguf\n    profiles: [{engine: llama.cpp, cpu: true}]\n"


@pytest.mark.parametrize(("models", "project", "binds"), [
    (MODEL + "    pricing: {output_per_mtok: 1}\n", "{budget_usd: 100}", True),
    (MODEL, "{budget_usd: 100}", False),
    (MODEL, "{budget: {usd: 100, period: month}}", False),
    (MODEL, "{budget_usd: 0}", True),  # refuses everything: binds without prices
    (MODEL, "{}", True),
    ("  {}\n", "{budget_usd: 100}", True),  # no model yet: nothing to call
], ids=["priced", "free-lifetime", "free-month", "zero", "no-budget", "no-model"])
def test_a_budget_over_free_models_is_a_located_error_with_the_fix(
        tmp_path: Path, models: str, project: str, binds: bool) -> None:
    (tmp_path / "cluster.yaml").write_text(
        f"cluster: {{name: lab}}\nprojects:\n  research: {project}\nmodels:\n{models}")
    if binds:
        loading.load(tmp_path)
        return
    with pytest.raises(SpecErrors) as caught:
        loading.load(tmp_path)
    text = str(caught.value)
    assert "cluster.yaml:3:" in text and "never binds" in text and "pricing:" in text, text
