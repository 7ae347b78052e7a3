"""A project's budget and the calendar periods it resets on.

``budget: {usd: 100, period: month, timezone: Europe/Paris}`` in a project:
spend counted against the budget is the spend of the current period only,
which starts at midnight of the first day of the month (``month``), of the
Monday (``week``, ISO weeks) or of the day (``day``) in ``timezone``; ``none``
is one period for ever (the lifetime ``budget_usd`` form).

:class:`Budget` is the file's type; :class:`Period` is the plain data the
router carries, and its methods are purely computational, the clock an
argument::

    period = Period("month", "Europe/Paris")
    period.start(now)      # Unix time of this month's first midnight in Paris
    period.resets(now)     # Unix time of the next one
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pydantic import Field, field_validator

from llmgw.spec.bases import Strict

PeriodKind = Literal["day", "week", "month", "none"]
PERIODS: tuple[PeriodKind, ...] = ("day", "week", "month", "none")


class Budget(Strict):
    usd: float = Field(ge=0, description="Spend limit in USD per period; requests past it "
                       "get 429 until the period resets.")
    period: PeriodKind = Field(
        "none",
        description="When spend resets: `day`, `week` (Monday), `month` (the 1st), at "
        "midnight in `timezone`; `none`: never (a lifetime budget, as `budget_usd`).",
    )
    timezone: str = Field(
        "UTC", description="IANA time zone of the period's midnights, e.g. `Europe/Paris`.",
    )

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone(value)  # ValueError: pydantic locates it
        return value


@lru_cache(maxsize=64)
def zone(name: str) -> zoneinfo.ZoneInfo:
    """The time zone ``name``; ValueError, saying what a name looks like, when unknown."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}: use an IANA name such as UTC, "
                         "Europe/Paris or America/New_York") from None


@dataclass(frozen=True)
class Period:
    """A budget's period: ``kind`` in :data:`PERIODS`, midnights in ``timezone``."""

    kind: PeriodKind = "none"
    timezone: str = "UTC"

    def start(self, now: float) -> float | None:
        """Unix time at which the period holding ``now`` began; None for ``none``."""
        if self.kind == "none":
            return None
        local = dt.datetime.fromtimestamp(now, zone(self.timezone))
        day = local.date()
        if self.kind == "week":
            day -= dt.timedelta(days=day.weekday())
        elif self.kind == "month":
            day = day.replace(day=1)
        return self._midnight(day)

    def resets(self, now: float) -> float | None:
        """Unix time of the next period's start after ``now``; None for ``none``."""
        if self.kind == "none":
            return None
        local = dt.datetime.fromtimestamp(now, zone(self.timezone)).date()
        if self.kind == "day":
            following = local + dt.timedelta(days=1)
        elif self.kind == "week":
            following = local + dt.timedelta(days=7 - local.weekday())
        else:
            following = (local.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        return self._midnight(following)

    def local(self, when: float) -> dt.datetime:
        """``when`` as a wall-clock time in the period's time zone."""
        return dt.datetime.fromtimestamp(when, zone(self.timezone))

    def instant(self, when: float) -> str:
        """``2026-01-01 00:00 Europe/Paris``: ``when`` in the period's time zone."""
        return f"{self.local(when):%Y-%m-%d %H:%M} {self.timezone}"

    def describe(self) -> str:
        """``month (Europe/Paris)``, ``day (UTC)``, ``lifetime``: for pages and tables."""
        return "lifetime" if self.kind == "none" else f"{self.kind} ({self.timezone})"

    def _midnight(self, day: dt.date) -> float:
        # Where midnight does not exist (a DST jump at 00:00), fold=0 takes the offset in
        # force before the jump: the instant is the first one of the day.
        when = dt.datetime(day.year, day.month, day.day, tzinfo=zone(self.timezone))
        return when.timestamp()


LIFETIME = Period()
