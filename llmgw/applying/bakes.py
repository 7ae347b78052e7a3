"""Running a rollout gate: probe the new replica, bake it on live traffic, judge.

For one create-before-destroy replacement whose new replica is Ready, with the
model's :class:`~llmgw.spec.rollouts.Rollout`:

1. **Probe**: one short chat completion sent straight to the new replica's
   engine (not through the router: no client ever sees its answer), judged by
   :func:`llmgw.applying.gates.check_probe`.
2. **Bake**: the new replica is routed as a canary with ``share`` of the
   model's requests (:class:`Traffic`, which the daemon implements with its
   router and, in HA, the store), and every ``poll`` seconds its tallies are
   judged against the old replica's (:func:`llmgw.applying.gates.judge`) until
   the bake time is over or it is found worse.

The :class:`~llmgw.applying.gates.Verdict` says promote or roll back and why;
removing the old or the new replica is :mod:`llmgw.applying.executions`' job.
Without a router in the process (``llmgw apply``), :class:`ProbeOnly` bakes
nothing and says so in the verdict.

Nothing here raises for a replica that fails: that is a verdict.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

import aiohttp

from llmgw.applying import gates
from llmgw.applying.gates import Verdict
from llmgw.planning.types import Change
from llmgw.spec.models import Cluster
from llmgw.spec.rollouts import Probe, Rollout

POLL = 1.0  # seconds between two looks at the canary's tallies
MAX_PROBE_BODY = 1 << 20


class Traffic(Protocol):
    """What a gate needs of the routers."""

    routing: bool  # False: no router to bake on (the probe alone decides)

    def url(self, node: str, port: int) -> str:
        """The base URL of an engine on ``node`` listening on ``port``."""
        ...

    async def share(self, url: str, share: float | None) -> None:
        """Route ``url`` as a canary with ``share`` of its model's requests (None: as any
        replica), once it is in the route table."""
        ...

    async def tallies(self) -> Mapping[str, Mapping[str, Any]]:
        """Every router's per-replica tallies, added up."""
        ...

    async def drain(self, urls: Collection[str]) -> None:
        """Take ``urls`` out of every router's table and wait (bounded) until no request
        is in flight on them."""
        ...


class ProbeOnly:
    """Traffic for a process without a router: URLs only."""

    routing = False

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def url(self, node: str, port: int) -> str:
        return base_url(self.cluster, node, port)

    async def share(self, url: str, share: float | None) -> None:
        return None

    async def tallies(self) -> Mapping[str, Mapping[str, Any]]:
        return {}

    async def drain(self, urls: Collection[str]) -> None:
        return None


def base_url(cluster: Cluster, node: str, port: int) -> str:
    spec = cluster.nodes.get(node)
    host = "127.0.0.1" if spec is None or spec.is_local else spec.address
    return f"http://{host}:{port}"


def head_urls(change: Change, traffic: Traffic) -> tuple[str | None, list[str]]:
    """The new replica's URL (its rank-0 shard serves HTTP) and the old replica's."""
    new = next((traffic.url(s.node, s.port) for s in change.shards
                if s.rank == 0 and s.port is not None), None)
    old = [traffic.url(s.node, s.port) for s in change.removes
           if s.rank == 0 and s.port is not None]
    return new, old


async def run(
    change: Change,
    rollout: Rollout,
    traffic: Traffic,
    served_name: str,
    *,
    poll: float = POLL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Verdict:
    """The gate of ``change``, whose new replica is Ready."""
    new, old = head_urls(change, traffic)
    if new is None:
        return Verdict("rollback", "the new replica has no HTTP port to probe")
    passed = Verdict("promote", "no probe")
    if rollout.probe is not None:
        passed = await probe(new, rollout.probe, served_name)
        if not passed.passed:
            return passed
    if rollout.bake <= 0:
        return passed
    if not traffic.routing:
        return Verdict("promote", f"{passed.reason}; not baked: no router in this process")
    await traffic.share(new, rollout.share)
    started = clock()
    while True:
        await sleep(poll)
        tallies = await traffic.tallies()
        verdict = gates.judge(rollout.compare, gates.stats(tallies, [new]),
                              gates.stats(tallies, old), baked=clock() - started >= rollout.bake)
        if verdict.decision != "wait":
            return verdict


async def probe(url: str, spec: Probe, served_name: str) -> Verdict:
    """Send the probe to the engine at ``url`` and judge its answer."""
    body = {"model": served_name, "messages": [{"role": "user", "content": spec.prompt}],
            "max_tokens": spec.max_tokens, "stream": False}
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=spec.timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
            f"{url}/v1/chat/completions", data=json.dumps(body),
            headers={"Content-Type": "application/json"},
        ) as reply:
            data = await reply.content.read(MAX_PROBE_BODY)
            status = reply.status
    except TimeoutError:
        return gates.check_probe(spec, None, b"", time.monotonic() - started,
                                 f"no answer within {spec.timeout:g} s")
    except aiohttp.ClientError as exc:
        return gates.check_probe(spec, None, b"", time.monotonic() - started,
                                 f"{type(exc).__name__}: {exc}")
    return gates.check_probe(spec, status, data, time.monotonic() - started)
