"""Each model's load over time, for the autoscaler (:func:`llmgw.planning.scaling.decide`).

The daemon records one :class:`~llmgw.planning.scaling.LoadSample` per model
each time it observes the fleet to plan: the routers' demand (waiting, queued,
in flight, first token) and the engines' own load from the same observation.
Samples are kept per model, oldest first, at most ``limit`` of them and none
older than the model's longest window (plus a margin): enough to judge
``up_window`` and ``down_window``, bounded whatever the traffic. A restarted
daemon starts with no history, and the planner holds the count until the
history covers the window (unknown is not idle).

Usage::

    histories = LoadHistories()
    loads = histories.record(cluster, fleet, demand, now)   # then plans.plan(..., loads=loads)
"""

from __future__ import annotations

from collections import deque

from llmgw.fleet.types import Demand, Fleet
from llmgw.planning import scaling
from llmgw.planning.scaling import LoadSample
from llmgw.spec.models import Cluster

__all__ = ["LIMIT", "LoadHistories", "LoadSample", "tick"]

LIMIT = 2000  # samples per model
MARGIN = 2.0  # windows kept: the oldest sample must reach back past the window's start
MIN_TICK = 1.0  # seconds: the shortest interval between plans that autoscaling asks for


class LoadHistories:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._samples: dict[str, deque[LoadSample]] = {}

    def record(
        self, cluster: Cluster, fleet: Fleet, demand: Demand, now: float,
    ) -> dict[str, tuple[LoadSample, ...]]:
        """Add a sample for each model with a scaling target; every such model's history.

        Models without a target, or no longer in the cluster, keep nothing.
        """
        targeted = {name: model.scaling for name, model in cluster.models.items()
                    if model.scaling.target is not None}
        for name in list(self._samples):
            if name not in targeted:
                del self._samples[name]
        for name, spec in targeted.items():
            samples = self._samples.setdefault(name, deque(maxlen=self.limit))
            if samples and samples[-1].at > now:
                samples.clear()  # the clock went back: what was recorded is not behind us
            samples.append(scaling.sample(name, cluster, fleet, demand, now))
            oldest = now - MARGIN * max(spec.up_window, spec.down_window)
            # Keep one sample at or before the oldest time: it stands for the load then.
            while len(samples) > 1 and samples[1].at <= oldest:
                samples.popleft()
        return self.histories()

    def histories(self) -> dict[str, tuple[LoadSample, ...]]:
        return {name: tuple(samples) for name, samples in self._samples.items()}

    def history(self, model: str) -> tuple[LoadSample, ...]:
        return tuple(self._samples.get(model, ()))


def tick(cluster: Cluster) -> float | None:
    """How often to plan so that every window is judged on several samples (a quarter of
    the shortest ``up_window``, at least ``MIN_TICK``); None when no model autoscales."""
    windows = [model.scaling.up_window for model in cluster.models.values()
               if model.scaling.target is not None]
    return max(MIN_TICK, min(windows) / 4) if windows else None
