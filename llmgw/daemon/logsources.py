"""The replicas' logs lent to the pages (/admin/logs): through the daemon's own agents.

The pages may not reach agents themselves (an import contract); the daemon
finds the unit in the fleet it last observed and asks its node's agent over
its pool (:mod:`llmgw.transport.logreads`), turning each failure into a
:class:`~llmgw.web.logviews.LogUnavailable` with an HTTP status and a
sentence for the admin.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

from llmgw.transport import logreads
from llmgw.transport.failures import NodeUnreachable
from llmgw.web.logviews import LogLines, LogUnavailable

if TYPE_CHECKING:
    from llmgw.daemon.reconcilers import Daemon


class DaemonLogs:
    """:class:`~llmgw.web.logviews.LogSource` over the running daemon (None: not yet)."""

    def __init__(self, daemon: Callable[[], Daemon | None]) -> None:
        self.daemon = daemon

    def _target(self, model: str, replica: int, shard: int | None
                ) -> tuple[Daemon, logreads.Target]:
        running = self.daemon()
        if running is None or running.state.fleet is None:
            raise LogUnavailable(503, "the daemon has not observed the fleet yet")
        try:
            return running, logreads.locate(running.state.fleet, model, replica, shard)
        except logreads.NotFound as exc:
            raise LogUnavailable(404, str(exc)) from None

    async def read(self, model: str, replica: int, shard: int | None, lines: int,
                   previous: bool) -> LogLines:
        running, target = self._target(model, replica, shard)
        try:
            found = await logreads.read(running.pool, target, lines, previous=previous)
        except logreads.NotFound as exc:
            raise LogUnavailable(404, str(exc)) from None
        except NodeUnreachable as exc:
            raise LogUnavailable(502, f"{exc.node}: {exc}") from None
        return LogLines(target.label(), found.source, found.lines)

    async def follow(self, model: str, replica: int, shard: int | None,
                     lines: int) -> AsyncGenerator[LogLines, None]:
        running, target = self._target(model, replica, shard)
        stream = logreads.follow(running.pool, target, lines)
        try:
            async for found in stream:
                yield LogLines(target.label(), found.source, found.lines)
        except logreads.NotFound as exc:
            raise LogUnavailable(404, str(exc)) from None
        except NodeUnreachable as exc:
            raise LogUnavailable(502, f"{exc.node}: {exc}") from None
        finally:
            await stream.aclose()
