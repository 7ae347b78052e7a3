"""The admission queue: requests wait here while every ready replica is at its cap.

A model's replicas each take at most ``routing.max_in_flight`` requests at
once (by default the engine's own slots). A request that finds them all full
waits in the model's queue instead of piling onto an engine, which would only
queue it inside, unfairly and out of the router's sight.

* **Bounded**: at most ``queue_limit`` requests per model wait; the next one
  is answered 503 ``queue_full``. One that waits longer than ``queue_timeout``
  is answered 503 ``queue_timeout``. Both carry ``Retry-After: 1`` and the
  router's OpenAI-shaped body (:mod:`llmgw.router.errors`).
* **Fair between projects**: when a slot frees, the next request comes from
  the next project in turn among those with requests queued (round robin: each
  project its share), and within one project first come, first served. A
  project sending ten times another's rate fills its own line, not the other's.
* **A client that leaves** (its handler is cancelled) leaves the queue; a slot
  already handed to it goes to the next in turn.
* Nothing of a request is kept here but its project's name and its wait.

``free(model, cap)`` is how many more requests the model's replicas take now
(:meth:`llmgw.router.routes.Routes.free`; None: no cap). :meth:`Admissions.pump`
is called whenever that may have grown: a request ended, the route table
changed, other routers' counts arrived. Everything runs on the router's event
loop; nothing locks. A slot is handed over synchronously: a woken request
picks its replica before the loop runs anything else, and ``granted`` counts
slots handed out but not yet taken, so a newcomer cannot take them first.

Usage::

    admissions = Admissions(routes.free)
    waited = await admissions.admit("chat", "research", cap=4, limit=1000, timeout=30)
    ...  # pick a replica under its cap and send; when it ends:
    admissions.pump("chat")
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from llmgw.router.errors import ApiError

Free = Callable[[str, "int | None"], "int | None"]


@dataclass(eq=False)
class _Waiter:
    project: str
    future: asyncio.Future[None]


@dataclass(eq=False)
class _Queue:
    cap: int | None = None
    granted: int = 0  # slots handed to waiters that have not picked their replica yet
    depth: int = 0
    lines: dict[str, deque[_Waiter]] = field(default_factory=dict)  # by project, in order
    turns: deque[str] = field(default_factory=deque)  # projects with a line, next first

    def push(self, waiter: _Waiter) -> None:
        line = self.lines.get(waiter.project)
        if line is None:
            line = self.lines[waiter.project] = deque()
            self.turns.append(waiter.project)  # a new project takes its turn after the others
        line.append(waiter)
        self.depth += 1

    def pop(self) -> _Waiter:
        """The next waiter: the first of the project whose turn it is."""
        project = self.turns.popleft()
        line = self.lines[project]
        waiter = line.popleft()
        if line:
            self.turns.append(project)
        else:
            del self.lines[project]
        self.depth -= 1
        return waiter

    def remove(self, waiter: _Waiter) -> None:
        line = self.lines.get(waiter.project)
        if line is None or waiter not in line:
            return
        line.remove(waiter)
        self.depth -= 1
        if not line:
            del self.lines[waiter.project]
            self.turns.remove(waiter.project)


class Admissions:
    """Every model's admission queue."""

    def __init__(self, free: Free, clock: Callable[[], float] = time.monotonic) -> None:
        self._free = free
        self._clock = clock
        self._queues: dict[str, _Queue] = {}

    def depth(self, model: str) -> int:
        queue = self._queues.get(model)
        return queue.depth if queue is not None else 0

    def depths(self) -> dict[str, int]:
        """Model → requests queued now (models with none left out)."""
        return {model: q.depth for model, q in self._queues.items() if q.depth}

    async def admit(self, model: str, project: str, *, cap: int | None, limit: int,
                    timeout: float) -> float | None:
        """Return once ``model`` has a free slot for this request, and it is its turn.

        Returns the seconds it waited in the queue, None when it did not wait. Raises
        :class:`ApiError` 503 ``queue_full`` or ``queue_timeout``; a cancelled caller
        (the client left) leaves the queue.
        """
        queue = self._queues.get(model)
        if queue is None:
            if cap is None:
                return None  # no cap, no queue: the common case costs one lookup
            queue = self._queues[model] = _Queue()
        queue.cap = cap
        if queue.depth == 0 and self._available(model, queue):
            return None
        if queue.depth >= limit:
            queued = "1 request is" if queue.depth == 1 else f"{queue.depth} requests are"
            raise ApiError(503, f"model {model!r} is at capacity: every replica is at its "
                           f"limit of requests in flight and {queued} queued (the model's "
                           "routing.queue_limit); retry in 1 s",
                           code="queue_full", type="server_error",
                           headers={"Retry-After": "1"})
        waiter = _Waiter(project, asyncio.get_running_loop().create_future())
        queue.push(waiter)
        began = self._clock()
        try:
            async with asyncio.timeout(timeout):
                await waiter.future
        except TimeoutError:
            if not _granted(waiter):
                queue.remove(waiter)
                raise ApiError(503, f"model {model!r} is at capacity: this request waited "
                               f"{timeout:g} s in its queue (the model's "
                               "routing.queue_timeout); retry in 1 s", code="queue_timeout",
                               type="server_error", headers={"Retry-After": "1"}) from None
            queue.granted -= 1  # the slot came as the time ran out: take it
        except BaseException:
            if _granted(waiter):  # handed a slot, then cancelled: pass it on
                queue.granted -= 1
                self.pump(model)
            else:
                queue.remove(waiter)
                waiter.future.cancel()
            raise
        else:
            queue.granted -= 1
        return self._clock() - began

    def pump(self, model: str) -> bool:
        """Hand free slots of ``model`` to its queued requests, in turn; False when the
        model has no queue (no cap)."""
        queue = self._queues.get(model)
        if queue is None:
            return False
        while queue.depth and self._available(model, queue):
            waiter = queue.pop()
            if waiter.future.done():
                # Cancelled (its client left, or its time ran out) but its task has not
                # run yet to leave the line itself: it is out of the line now.
                continue
            waiter.future.set_result(None)
            queue.granted += 1
        if not queue.depth and not queue.granted and queue.cap is None:
            del self._queues[model]  # the model lost its cap: back to the fast path
        return True

    def pump_all(self) -> None:
        for model in list(self._queues):
            self.pump(model)

    def configure(self, caps: dict[str, int | None]) -> None:
        """New caps by model (a spec reload); a model left out has none. Wakes whoever
        a raised or removed cap lets through."""
        for model, queue in self._queues.items():
            queue.cap = caps.get(model)
        self.pump_all()

    def _available(self, model: str, queue: _Queue) -> bool:
        free = self._free(model, queue.cap)
        return free is None or free - queue.granted > 0


def _granted(waiter: _Waiter) -> bool:
    future = waiter.future
    return future.done() and not future.cancelled()
