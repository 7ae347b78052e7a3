"""Usage export: the usage rows summed per project, key, model and day, as CSV or JSON.

``llmgw usage export`` and the admin API's ``GET /api/v1/usage`` both go
through :func:`parse` (the flags, checked; every refusal says which flag and
why) and :func:`export`. The figures come from the usage rows, the same ones
/admin charts (:func:`llmgw.store.usages.series`), so they agree with it for
the same window; the rows hold no text, so neither does an export.

* **The window** is ``[from, to)``: a date means its midnight, a date and time
  without an offset is read in ``tz``, one with an offset as it is.
* **Days** are calendar days in ``tz`` (default UTC; any IANA name, such as
  ``Europe/Berlin``), daylight-saving changes included. The store sums rows
  per quarter hour (every offset in use is a whole number of quarter hours)
  and this module folds those into local days.
* **Columns**: the group keys in the order asked, then ``requests``,
  ``prompt_tokens``, ``completion_tokens``, ``cost_usd`` and ``errors``
  (requests answered with a status of 400 or more). A row without a project or
  key (``auth: none``) has an empty cell (JSON: null) there.
* **CSV** is written by :mod:`csv`; a group cell that starts with ``=``,
  ``+``, ``-``, ``@``, a tab or a carriage return is prefixed with ``'`` so no
  spreadsheet takes it for a formula.

This module holds the query, its formatting, the :class:`ExportMethods` part
of the store interface and the SQL of both databases.
"""

from __future__ import annotations

import abc
import csv
import datetime as dt
import io
import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg

if TYPE_CHECKING:
    from llmgw.store.stores import Store

GROUPS = {"project": "project", "key": "key_id", "model": "model"}  # group → usage column
VOCABULARY = ("project", "key", "model", "day")
FORMATS = ("csv", "json")
FIGURES = ("requests", "prompt_tokens", "completion_tokens", "cost_usd", "errors")
SLOT = 900.0  # seconds: the store sums per quarter hour when days are asked for
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Query:
    """What to export: a window ``[start, end)`` in Unix time, the groups, the format."""

    start: float
    end: float
    group_by: tuple[str, ...]
    format: Literal["csv", "json"]
    tz: str = "UTC"


@dataclass(frozen=True)
class Sums:
    """The usage rows of one group (and quarter hour, when asked) as the store sums them."""

    groups: tuple[str | None, ...]  # in the order of the columns asked
    slot: int | None  # floor(ts / SLOT), when days were asked for
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    errors: int


@dataclass(frozen=True)
class Line:
    """One exported row: its group keys (by name) and its figures."""

    keys: dict[str, str | None]
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    errors: int


class ExportMethods(abc.ABC):
    """The usage export's part of :class:`~llmgw.store.stores.Store`."""

    @abc.abstractmethod
    async def usage_sums(self, start: float, end: float, columns: Sequence[str],
                         slot: float | None) -> list[Sums]:
        """Usage rows with ``start <= ts < end`` summed per value of ``columns`` (keys of
        :data:`GROUPS`) and, with ``slot``, per ``floor(ts / slot)``."""


def parse(start: str | None, end: str | None, group_by: str | None, fmt: str | None,
          tz: str | None, flag: Callable[[str], str] = lambda name: f"--{name}") -> Query:
    """The export asked for, checked; ValueError names the flag (``flag(name)``) and says
    what it takes. Purely computational."""
    zone_name = tz or "UTC"
    try:
        if len(zone_name) > 64:
            raise ValueError
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{flag('tz')} {zone_name[:40]!r} is not a time zone: use an IANA "
                         "name such as UTC or Europe/Berlin") from None
    if not start or not end:
        raise ValueError(f"{flag('from')} and {flag('to')} are both needed: a date "
                         "(2026-11-01) or a date and time (2026-11-01T08:00)")
    begins, ends = _instant(start, zone, flag("from")), _instant(end, zone, flag("to"))
    if ends <= begins:
        raise ValueError(f"{flag('to')} must be after {flag('from')} (the window is "
                         "[from, to): --to 2026-12-01 ends with the last moment of Nov 30)")
    groups = tuple(g.strip() for g in (group_by or "").split(",") if g.strip())
    unknown = [g for g in groups if g not in VOCABULARY]
    if unknown:
        raise ValueError(f"{flag('group-by')}: {unknown[0][:40]!r} is not one of "
                         f"{', '.join(VOCABULARY)}")
    if len(set(groups)) != len(groups):
        raise ValueError(f"{flag('group-by')} names a group twice")
    kind = fmt or "csv"
    if kind not in FORMATS:
        raise ValueError(f"{flag('format')} {kind[:40]!r} is not one of {', '.join(FORMATS)}")
    return Query(begins, ends, groups, "json" if kind == "json" else "csv", zone_name)


def _instant(text: str, zone: ZoneInfo, name: str) -> float:
    try:
        if len(text) > 40:
            raise ValueError
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            return dt.datetime.combine(day, dt.time(), zone).timestamp()
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name} {text[:40]!r} is not a date (2026-11-01) or a date and time "
                         "(2026-11-01T08:00, 2026-11-01T08:00+01:00)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=zone)).timestamp()


async def export(store: Store, query: Query) -> list[Line]:
    """The rows of ``query``, sorted by their group keys."""
    columns = [g for g in query.group_by if g in GROUPS]
    days = "day" in query.group_by
    sums = await store.usage_sums(query.start, query.end, columns, SLOT if days else None)
    return fold(sums, query)


def fold(sums: Sequence[Sums], query: Query) -> list[Line]:
    """The store's sums folded into the rows asked for (quarter hours into local days).
    Purely computational."""
    zone = ZoneInfo(query.tz)
    columns = [g for g in query.group_by if g in GROUPS]
    totals: dict[tuple[str | None, ...], list[Any]] = {}
    for item in sums:
        named = dict(zip(columns, item.groups, strict=True))
        if "day" in query.group_by:
            assert item.slot is not None
            named["day"] = dt.datetime.fromtimestamp(item.slot * SLOT, zone).date().isoformat()
        keys = tuple(named[g] for g in query.group_by)
        figures = totals.setdefault(keys, [0, 0, 0, 0.0, 0])
        for i, amount in enumerate((item.requests, item.prompt_tokens, item.completion_tokens,
                                    item.cost_usd, item.errors)):
            figures[i] += amount
    return [Line(dict(zip(query.group_by, keys, strict=True)), *figures)
            for keys, figures in sorted(totals.items(), key=lambda kv: [k or "" for k in kv[0]])]


def csv_text(lines: Sequence[Line], query: Query) -> str:
    """The rows as CSV, with a header; group cells guarded against formulas."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*query.group_by, *FIGURES])
    for line in lines:
        writer.writerow([*(_cell(line.keys[g]) for g in query.group_by), line.requests,
                         line.prompt_tokens, line.completion_tokens, f"{line.cost_usd:.6f}",
                         line.errors])
    return out.getvalue()


def _cell(text: str | None) -> str:
    if text is None:
        return ""
    return "'" + text if text.startswith(_FORMULA) else text


def document(lines: Sequence[Line], query: Query) -> dict[str, Any]:
    """The rows as JSON: the window, the groups, each row, and the totals."""
    def figures(line: Line) -> dict[str, Any]:
        return {"requests": line.requests, "prompt_tokens": line.prompt_tokens,
                "completion_tokens": line.completion_tokens,
                "cost_usd": round(line.cost_usd, 6), "errors": line.errors}
    total = Line({}, sum(x.requests for x in lines), sum(x.prompt_tokens for x in lines),
                 sum(x.completion_tokens for x in lines), sum(x.cost_usd for x in lines),
                 sum(x.errors for x in lines))
    return {"from": _iso(query.start, query.tz), "to": _iso(query.end, query.tz),
            "tz": query.tz, "group_by": list(query.group_by),
            "rows": [{**line.keys, **figures(line)} for line in lines],
            "totals": figures(total)}


def render(lines: Sequence[Line], query: Query) -> str:
    """The rows in the query's format."""
    if query.format == "json":
        return json.dumps(document(lines, query), indent=2) + "\n"
    return csv_text(lines, query)


def _iso(ts: float, tz: str) -> str:
    return dt.datetime.fromtimestamp(ts, ZoneInfo(tz)).isoformat()


# -- SQL of both databases; ``columns`` are keys of GROUPS, never client text ---------------
def _select(columns: Sequence[str], slot: str) -> str:
    names = [GROUPS[c] for c in columns]
    grouped = ", ".join([*names, slot])
    return (f"SELECT {grouped}, COUNT(*), SUM(COALESCE(prompt_tokens, 0)), "
            "SUM(COALESCE(completion_tokens, 0)), SUM(cost_usd), "
            "SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END) FROM usage "
            "WHERE ts >= {start} AND ts < {end} "
            f"GROUP BY {', '.join(str(i + 1) for i in range(len(names) + 1))}")


def _sums(row: Sequence[Any], width: int, slotted: bool) -> Sums:
    groups = tuple(None if v is None else str(v) for v in row[:width])
    slot, requests, prompt, completion, cost, errors = row[width:]
    return Sums(groups, int(slot) if slotted else None, int(requests), int(prompt or 0),
                int(completion or 0), float(cost or 0.0), int(errors or 0))


def sqlite_sums(conn: sqlite3.Connection, start: float, end: float, columns: Sequence[str],
                slot: float | None) -> list[Sums]:
    for c in columns:
        GROUPS[c]  # noqa: B018 - a KeyError for anything but a known group
    expression = f"CAST(ts / {float(slot)!r} AS INTEGER)" if slot else "0"
    query = _select(columns, expression).format(start="?", end="?")
    return [_sums(r, len(columns), slot is not None)
            for r in conn.execute(query, (start, end)).fetchall()]


async def postgres_sums(conn: asyncpg.pool.PoolConnectionProxy, start: float, end: float,
                        columns: Sequence[str], slot: float | None) -> list[Sums]:
    for c in columns:
        GROUPS[c]  # noqa: B018 - a KeyError for anything but a known group
    expression = f"FLOOR(ts / {float(slot)!r})::bigint" if slot else "0"
    query = _select(columns, expression).format(start="$1", end="$2")
    return [_sums(tuple(r), len(columns), slot is not None)
            for r in await conn.fetch(query, start, end)]
