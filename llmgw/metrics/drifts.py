"""Drift as metrics: how often each class of drift appeared on each node, and what is held.

``llmgw_drift_total{class,node}`` counts *episodes*: a drift (one class, on
one node, of one replica) counts once when it first appears in a plan, not
once per plan while it lasts; when it is gone and comes back, it counts
again. ``llmgw_drift_held{class,node}`` is the number of replicas held
(not repaired) now. Classes are those of :mod:`llmgw.planning.drifts`.

Usage::

    counts = drifts.DriftCounts()
    counts.observe(plan)          # after each plan
    families = counts.families()  # at scrape time
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmgw.planning import drifts
from llmgw.planning.types import Plan

Episode = tuple[str, str, str]  # (class, node, replica)


class DriftCounts:
    def __init__(self) -> None:
        self._present: set[Episode] = set()
        self._totals: Counter[tuple[str, str]] = Counter()
        self._held: Counter[tuple[str, str]] = Counter()

    def observe(self, plan: Plan) -> None:
        """Count the drifts of ``plan`` that the previous plan did not have."""
        now = set(drifts.events(plan))
        for kind, node, _ in sorted(now - self._present):
            self._totals[(kind, node)] += 1
        self._present = now
        self._held = Counter((h.drift, node) for h in plan.held for node in h.nodes)

    def families(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "llmgw_drift", "Drift episodes seen, per class and node (a drift that lasts "
            "counts once).", labels=["class", "node"])
        for (kind, node), value in sorted(self._totals.items()):
            total.add_metric([kind, node], value)
        held = GaugeMetricFamily(
            "llmgw_drift_held", "Replicas held now (drift shown, not repaired), per class and "
            "node.", labels=["class", "node"])
        for (kind, node), value in sorted(self._held.items()):
            held.add_metric([kind, node], value)
        yield from (total, held)
