"""A rollout gate's bake on a real router: canary routed, tallied, judged, drained.

The daemon's :class:`RouterTraffic` drives a real router in front of two real
upstreams while a client sends requests the whole time: a canary that fails
live requests is rolled back on its error rate (and no client saw an error), a
good one is promoted on the comparison; a drain takes a replica out of the table.
"""

from __future__ import annotations

import threading
from typing import Any

import openai
import pytest
from support.stacks import Stack
from support.upstream import Upstream

from llmgw.applying import bakes
from llmgw.daemon.canaries import RouterTraffic
from llmgw.planning.types import Change, ObservedShard, Shard
from llmgw.router import Endpoint
from llmgw.spec.models import Cluster
from llmgw.spec.rollouts import Rollout

SPEC = Cluster.model_validate({"cluster": {"name": "t"}, "nodes": {"local": {"address": "local"}},
                               "models": {}})


def change(old: Upstream, new: Upstream) -> Change:
    shard = Shard("chat", 1, 0, 1, "local", "llmgw-chat-r1-s0.service", "llama.cpp", None, (),
                  new.port, "new", {})
    gone = ObservedShard("local", "llmgw-chat-r0-s0.service", 0, "old", "ready", old.port)
    return Change("replace", "chat", 0, ("args changed",), shards=(shard,), removes=(gone,),
                  strategy="create-before-destroy", new_replica=1)


def traffic(stack: Stack) -> RouterTraffic:
    old, new = stack.upstreams
    table = {"chat": [Endpoint(old.url, "local", 0), Endpoint(new.url, "local", 1)]}

    async def republish() -> None:
        stack.router.update_routes(result.adjust(table))

    result = RouterTraffic(lambda: SPEC, republish, stack.router, None, None, drain_timeout=5)
    stack.call(stack.router.update_routes, result.adjust({"chat": table["chat"][:1]}))
    return result


class Client(threading.Thread):
    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(),
                                    max_retries=0)
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.sent = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.sent += 1
            try:
                self.client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}])
            except openai.OpenAIError as exc:
                self.failures.append(str(exc))


def bake(stack: Stack, rollout: Rollout, before: Any = None) -> tuple[bakes.Verdict, Client]:
    old, new = stack.upstreams
    road = traffic(stack)
    client = Client(stack)
    client.start()
    try:
        verdict = stack.run(bakes.run(change(old, new), rollout, road, "chat", poll=0.05),
                            timeout=60)
    finally:
        client.stop.set()
        client.join(10)
    return verdict, client


def test_a_canary_failing_live_requests_is_rolled_back_and_no_client_sees_it(
    stack: Stack,
) -> None:
    old, new = stack.upstreams
    rollout = Rollout(bake=60, share=0.5, compare={"min_requests": 4})
    flipped = threading.Event()

    def flip() -> None:  # the probe passes; live traffic then fails
        while not new.received:
            flipped.wait(0.01)
        new.status = 500
        flipped.set()

    threading.Thread(target=flip, daemon=True).start()
    verdict, client = bake(stack, rollout)
    assert verdict.decision == "rollback"
    assert verdict.reason.startswith("error rate ") and " vs 0.0% (" in verdict.reason
    assert client.failures == [] and client.sent > 4
    assert new.received[0].body["max_tokens"] == 8  # the probe came first, straight to it


def test_a_good_canary_is_promoted_on_the_comparison(stack: Stack) -> None:
    old, new = stack.upstreams
    # The stand-in upstreams answer in microseconds: their TTFT ratio is noise on a busy
    # machine, so only the error rates decide here (the ratio is tests/applying's).
    verdict, client = bake(stack, Rollout(bake=1, share=0.5, compare={
        "min_requests": 2, "max_ttft_ratio": 1000}))
    assert verdict.decision == "promote"
    assert verdict.reason.startswith("error rate 0.0% vs 0.0%, p50 TTFT ")
    assert client.failures == []
    assert len(new.received) >= 3 and len(old.received) >= 2  # probe + its share


def test_a_canary_failing_its_probe_gets_no_traffic(stack: Stack) -> None:
    old, new = stack.upstreams
    new.status = 503
    verdict, client = bake(stack, Rollout(bake=60))
    assert (verdict.decision, verdict.reason) == ("rollback", "probe answered 503, expected 200")
    assert len(new.received) == 1  # the probe alone
    assert client.failures == []


@pytest.mark.parametrize("which", ["old", "new"])
def test_a_drain_takes_a_replica_out_of_the_routes(stack: Stack, which: str) -> None:
    old, new = stack.upstreams
    road = traffic(stack)
    stack.run(road.share(new.url, None))
    gone = old if which == "old" else new
    stack.run(road.drain([gone.url]))
    kept = {e.base_url for e in stack.call(stack.router.routes.endpoints, "chat")}
    assert kept == {old.url, new.url} - {gone.url}
