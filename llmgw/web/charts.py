"""Server-rendered SVG: capacity bars and usage-over-time charts.

Pure functions from numbers to SVG markup (a :class:`markupsafe.Markup`, so
templates embed it as is). Every text that came from outside (project, key or
model names) is escaped here; colours are classes styled by ``app.css``, so
the pages' Content-Security-Policy needs no inline styles.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from llmgw.planning.summaries import GpuCounts
from llmgw.spec.budgets import LIFETIME, Period
from llmgw.store.usages import Bucket

PALETTE = 8  # series colours: classes s0 … s7 in app.css
MAX_SERIES = 8  # more groups than this: the largest are drawn, the rest summed as "other"
LEGEND_COLUMNS = 2  # key entries per row under a chart: long model names need the room


def capacity_bar(name: str, counts: GpuCounts, width: int = 320) -> Markup:
    """One stacked bar: used, free and faulty GPUs of a class."""
    total = max(counts.total, 1)
    parts = [("used", counts.used), ("free", counts.free), ("faulty", counts.faulty)]
    x = 0.0
    rects = []
    for kind, value in parts:
        w = width * value / total
        if value:
            rects.append(f'<rect class="{kind}" x="{x:.1f}" y="0" width="{w:.1f}" height="18">'
                         f"<title>{value} {kind}</title></rect>")
        x += w
    label = (f"{escape(name)}: {counts.used} used, {counts.free} free, {counts.faulty} faulty "
             f"of {counts.total}")
    return Markup(
        f'<svg class="bar" role="img" aria-label="{label}" width="{width}" height="18" '
        f'viewBox="0 0 {width} 18" xmlns="http://www.w3.org/2000/svg">'
        f'<rect class="track" x="0" y="0" width="{width}" height="18"/>{"".join(rects)}</svg>'
    )


def usage_chart(
    buckets: Sequence[Bucket], *, since: float, step: float, slots: int, value: str,
    title: str, width: int = 540, height: int = 190,
) -> Markup:
    """Lines over time, one per group; ``value`` is ``requests``, ``tokens`` or ``cost_usd``."""
    series = _series(buckets, since, step, slots, value)
    left, right, top, bottom = 56, 8, 26, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((v for values in series.values() for v in values), default=0.0) or 1.0
    # A viewBox and no fixed size: the chart scales to the width it gets (a phone's),
    # its text and lines with it; app.css caps it at its drawn width.
    full = height + 18 * -(-len(series) // LEGEND_COLUMNS)
    out = [f'<svg class="chart" role="img" aria-label="{escape(title)}" width="100%" '
           f'viewBox="0 0 {width} {full}" xmlns="http://www.w3.org/2000/svg">'
           f"<title>{escape(title)}</title>",
           f'<text class="heading" x="{left}" y="14">{escape(title)}</text>',
           f'<g transform="translate({left},{top})">',
           f'<line class="axis" x1="0" y1="{plot_h}" x2="{plot_w}" y2="{plot_h}"/>',
           f'<line class="axis" x1="0" y1="0" x2="0" y2="{plot_h}"/>',
           f'<text class="tick" x="-4" y="8" text-anchor="end">{_number(peak, value)}</text>',
           f'<text class="tick" x="-4" y="{plot_h}" text-anchor="end">0</text>']
    for at, anchor in ((0, "start"), (slots - 1, "end")):
        stamp = time.strftime("%m-%d %H:%M", time.gmtime(since + at * step))
        x = plot_w * at / max(slots - 1, 1)
        out.append(f'<text class="tick" x="{x:.1f}" y="{plot_h + 14}" '
                   f'text-anchor="{anchor}">{stamp} UTC</text>')
    for index, (group, values) in enumerate(series.items()):
        points = " ".join(
            f"{plot_w * i / max(slots - 1, 1):.1f},{plot_h - plot_h * v / peak:.1f}"
            for i, v in enumerate(values))
        total = _number(sum(values), value)
        out.append(f'<polyline class="line s{index % PALETTE}" points="{points}">'
                   f"<title>{escape(group)}: {total}</title></polyline>")
    out.append("</g>")
    for index, (group, values) in enumerate(series.items()):
        x = left + (index % LEGEND_COLUMNS) * (plot_w // LEGEND_COLUMNS)
        y = height + 14 + 18 * (index // LEGEND_COLUMNS)
        out.append(f'<rect class="key s{index % PALETTE}" x="{x}" y="{y - 9}" width="10" '
                   f'height="10"/><text class="legend" x="{x + 14}" y="{y}">'
                   f"{escape(_short(group))} ({_number(sum(values), value)})</text>")
    if not series:
        out.append(f'<text class="empty" x="{left + 8}" y="{top + plot_h // 2}">no requests '
                   "in this period</text>")
    out.append("</svg>")
    return Markup("".join(out))


def _series(buckets: Sequence[Bucket], since: float, step: float, slots: int,
            value: str) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for bucket in buckets:
        slot = int(round((bucket.start - since) / step))
        if 0 <= slot < slots:
            groups.setdefault(bucket.group, [0.0] * slots)[slot] += float(getattr(bucket, value))
    ranked = sorted(groups.items(), key=lambda item: (-sum(item[1]), item[0]))
    if len(ranked) > MAX_SERIES:
        rest = [sum(v) for v in zip(*(values for _, values in ranked[MAX_SERIES - 1:]),
                                    strict=True)]
        ranked = [*ranked[: MAX_SERIES - 1], ("other", rest)]
    return dict(ranked)


def _number(amount: float, value: str) -> str:
    if value == "cost_usd":
        return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.6f}"
    return f"{amount:,.0f}"


def _short(text: str, limit: int = 26) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class BudgetRow:
    """One project's line in a budgets table."""

    project: str
    spent: float  # in the current period (for ever, without one)
    budget: float | None  # USD; None: unlimited
    pct: int | None  # percent of the budget spent; None: unlimited
    period: str  # "month (Europe/Paris)", or "lifetime"
    resets: str | None  # "2026-07-01 00:00 Europe/Paris"; None: never


def budgets(spent: Mapping[str, float], limits: Mapping[str, float | None],
            periods: Mapping[str, Period], now: float) -> list[BudgetRow]:
    """A row for every project, sorted by name: ``spent[p]`` is its spend in the period
    of ``periods[p]`` holding ``now`` (absent: a lifetime budget). Purely computational."""
    rows = []
    for project in sorted(set(limits) | set(spent)):
        budget = limits.get(project)
        used = spent.get(project, 0.0)
        pct = None if not budget else min(999, int(100 * used / budget))
        period = periods.get(project, LIFETIME)
        resets = period.resets(now)
        rows.append(BudgetRow(project, used, budget, pct, period.describe(),
                              None if resets is None else period.instant(resets)))
    return rows
