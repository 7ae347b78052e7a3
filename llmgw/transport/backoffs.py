"""When to try a failing node again: exponential backoff with jitter.

A daemon that re-plans every minute must not hammer a node that is down, and
twenty daemons (or twenty nodes coming back at once) must not retry in
lock-step. After each failed connection attempt the next one is allowed only
after a delay drawn from ``[d/2, d]``, ``d = min(cap, base · 2^(failures-1))``
("equal jitter": never zero, never synchronised). A success resets it.

The clock and the random source are arguments, so the schedule is tested
without sleeping.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Retry schedule of one node. ``wait()`` is how long until the next attempt may start."""

    base: float = 1.0
    cap: float = 60.0
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0
    not_before: float = 0.0

    def wait(self) -> float:
        """Seconds until another attempt is allowed; 0 when one may start now."""
        return max(0.0, self.not_before - self.clock())

    def failed(self) -> float:
        """Record a failed attempt; returns the delay chosen before the next one."""
        self.failures += 1
        ceiling = min(self.cap, self.base * 2.0 ** (self.failures - 1))
        delay = ceiling / 2 + self.rng.uniform(0, ceiling / 2)
        self.not_before = self.clock() + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.not_before = 0.0
