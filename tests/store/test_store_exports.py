"""Usage export on both stores: sums per project, key, model and local day, over the
window ``[from, to)``, from rows inserted through the store's real usage path.

Every store test runs on SQLite and on a real PostgreSQL (fixture ``store_settings``).
"""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import exports, stores
from llmgw.store.usages import UsageRow

UTC = dt.UTC


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def row(ts: str, project: str | None, key: str | None, model: str, status: int = 200,
        prompt: int | None = 10, completion: int | None = 5, cost: float = 0.25) -> UsageRow:
    return UsageRow(at(ts), project, key, model, "/v1/chat/completions", status, prompt,
                    completion, 12.0, cost)


ROWS = [
    row("2026-11-30T23:59:59", "research", "aaaaaaaaaaaa", "chat"),  # before the window
    row("2026-12-01T00:00:00", "research", "aaaaaaaaaaaa", "chat"),
    row("2026-12-01T10:00:00", "research", "aaaaaaaaaaaa", "chat", status=500, prompt=None,
        completion=None, cost=0.0),
    row("2026-12-01T23:30:00", "research", "bbbbbbbbbbbb", "coder", cost=1.5),
    row("2026-12-02T08:00:00", "ops", "cccccccccccc", "chat", cost=0.5),
    row("2026-12-02T09:00:00", None, None, "chat", cost=0.0),  # auth: none
    row("2026-12-03T00:00:00", "ops", "cccccccccccc", "chat"),  # the end is excluded
]


async def exported(settings: dict[str, str], *flags: str | None) -> list[exports.Line]:
    query = exports.parse(*flags)  # type: ignore[arg-type]
    store = await stores.open_store(StoreSettings.model_validate(settings))
    try:
        if not await store.recent_usage(1):  # once per store
            await store.insert_usage(ROWS)
        return await exports.export(store, query)
    finally:
        await store.close()


def table(lines: list[exports.Line]) -> list[tuple[object, ...]]:
    return [(*line.keys.values(), line.requests, line.prompt_tokens, line.completion_tokens,
             round(line.cost_usd, 6), line.errors) for line in lines]


async def test_by_project_model_and_utc_day(store_settings: dict[str, str]) -> None:
    lines = await exported(store_settings, "2026-12-01", "2026-12-03", "day,project,model",
                           "json", None)
    assert table(lines) == [
        ("2026-12-01", "research", "chat", 2, 10, 5, 0.25, 1),
        ("2026-12-01", "research", "coder", 1, 10, 5, 1.5, 0),
        ("2026-12-02", None, "chat", 1, 10, 5, 0.0, 0),
        ("2026-12-02", "ops", "chat", 1, 10, 5, 0.5, 0),
    ]


async def test_days_in_another_time_zone_and_no_groups(store_settings: dict[str, str]) -> None:
    # Berlin is UTC+1 in December: the window's midnights are Berlin's (23:00 UTC the day
    # before), so 23:59:59 UTC on Nov 30 is in and 00:00 UTC on Dec 3 is out, and 23:30
    # UTC on Dec 1 is 00:30 on Dec 2 there.
    lines = await exported(store_settings, "2026-12-01", "2026-12-03", "day,key", "csv",
                           "Europe/Berlin")
    assert table(lines) == [
        ("2026-12-01", "aaaaaaaaaaaa", 3, 20, 10, 0.5, 1),
        ("2026-12-02", None, 1, 10, 5, 0.0, 0),
        ("2026-12-02", "bbbbbbbbbbbb", 1, 10, 5, 1.5, 0),
        ("2026-12-02", "cccccccccccc", 1, 10, 5, 0.5, 0),
    ]
    [total] = await exported(store_settings, "2026-12-01T00:00:00Z", "2026-12-03", "", "csv",
                             None)
    assert (total.keys, total.requests, total.cost_usd) == ({}, 5, 2.25)


def test_csv_has_the_columns_and_guards_formula_cells() -> None:
    query = exports.parse("2026-12-01", "2026-12-02", "project,model", "csv", None)
    lines = [exports.Line({"project": "=HYPERLINK(1)", "model": None}, 1, 2, 3, 0.5, 0),
             exports.Line({"project": "ops", "model": "-chat"}, 4, 5, 6, 0.000001, 1)]
    parsed = list(csv.reader(io.StringIO(exports.csv_text(lines, query))))
    assert parsed == [
        ["project", "model", "requests", "prompt_tokens", "completion_tokens", "cost_usd",
         "errors"],
        ["'=HYPERLINK(1)", "", "1", "2", "3", "0.500000", "0"],
        ["ops", "'-chat", "4", "5", "6", "0.000001", "1"],
    ]


@pytest.mark.parametrize(("flags", "message"), [
    ((None, "2026-12-02", "project", "csv", None), "--from and --to are both needed"),
    (("yesterday", "2026-12-02", "project", "csv", None), "--from 'yesterday' is not a date"),
    (("2026-12-01", "2026-13-01", "project", "csv", None), "--to '2026-13-01' is not a date"),
    (("2026-12-02", "2026-12-01", "project", "csv", None), "--to must be after --from"),
    (("2026-12-01", "2026-12-02", "project,user", "csv", None),
     "--group-by: 'user' is not one of project, key, model, day"),
    (("2026-12-01", "2026-12-02", "day,day", "csv", None), "names a group twice"),
    (("2026-12-01", "2026-12-02", "day", "xlsx", None), "--format 'xlsx' is not one of"),
    (("2026-12-01", "2026-12-02", "day", "csv", "Mars/Olympus"), "is not a time zone"),
    (("2026-12-01", "2026-12-02", "day", "csv", "../../etc/passwd"), "is not a time zone"),
])
def test_bad_flags_are_refused_naming_the_flag(flags: tuple[str | None, ...],
                                               message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        exports.parse(*flags)  # type: ignore[arg-type]
