"""Autoscaling with real llama-servers and real load, end to end.

``llmgw serve`` runs ``make run``'s local cluster (the supervise backend, the real
``llama-server`` with Gemma 3 270M), the model scaling between one replica and two on
``waiting_per_replica``, with windows and a cooldown of seconds so that the test is quick.
Each replica has two slots (``--parallel 2``) and the router lets two requests at a time
reach it (``routing.max_in_flight``), so the rest of a burst waits in the router's queue:
the waiting count the autoscaler reads. The official ``openai`` client sends, in turn
(``tests/support/bursts.py``):

1. a steady trickle, below the target: the replica count does not move (no flapping);
2. a burst of streams kept open at once: the waiting count rises past the target (the
   plan's reason says how far), the autoscaler places a second replica, and the burst's
   time to first token falls once it is ready (the median of the requests begun before
   it was placed against those begun after it was ready; the ratio is printed);
3. three streams kept open, one more than a replica's slots: the waiting count falls, and
   after the down window and the cooldown a replica drains and stops. Each replica holds
   at least one of the streams when the plan picks one to go, so a replica stopped
   before its streams ended would fail a request. The plan decides twice in all: 1 → 2 and 2 → 1.

No request fails during any of it. Wall clock is asserted nowhere: only the order of
events, the windows as lower bounds (a replica may not go sooner than they allow), and
time to first token before against after on the same machine in the same run.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import bursts, daemons, scaledclusters
from support.scaledclusters import Replicas, Sample

pytestmark = pytest.mark.skipif(
    not scaledclusters.built(),
    reason="the real engine and model are built by `make engine model` (make test does)",
)

UP_WINDOW, DOWN_WINDOW, COOLDOWN = 2.0, 5.0, 5.0
TARGET = 2  # requests waiting per ready replica
SLOTS = 2  # llama-server --parallel, and the router's cap per replica
SCALING = {"min": 1, "max": 2, "target": {"waiting_per_replica": TARGET},
           "up_window": f"{UP_WINDOW:g}s", "down_window": f"{DOWN_WINDOW:g}s",
           "cooldown": f"{COOLDOWN:g}s"}
ROUTING = {"max_in_flight": SLOTS}
TRICKLE = 1.0  # requests/s: about one stream in flight, nothing waits
BURST = 8  # streams open at once: six wait behind one replica's two slots
# After the burst, one stream more than a replica's slots, kept open: nothing waits while
# two replicas serve them, and with the cap each of the two holds at least one when the
# plan picks one to go, so a scale-down that did not drain would cut a stream.
AFTER = SLOTS + 1
AFTER_READY = 8  # burst requests begun once the second replica is ready, to compare


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[daemons.Daemon]:
    served = scaledclusters.start(tmp_path, scaling=SCALING, routing=ROUTING,
                                  args={**scaledclusters.ARGS, "parallel": SLOTS})
    try:
        yield served
    finally:
        served.stop(signal.SIGINT)


def one_ready(sample: Sample) -> bool:
    return len(sample.states) == 1 and sample.ready() == 1


async def test_a_burst_scales_out_and_back_in_without_a_failed_request(
    daemon: daemons.Daemon,
) -> None:
    with Replicas(daemon) as replicas:
        await asyncio.to_thread(replicas.wait, one_ready, "the first replica", 120)
        load = bursts.Load(f"{daemon.router}/v1", scaledclusters.NAME)
        marks: dict[str, float] = {}

        def second_ready_and_measured() -> bool:
            ready = replicas.first(lambda s: s.ready() == 2)
            if ready is None:
                return False
            marks.setdefault("ready", ready.at)
            begun = [o for o in load.outcomes if o.phase == "burst" and o.started >= ready.at]
            return len(begun) >= AFTER_READY

        def back_to_one() -> bool:
            since = marks.get("ready", float("inf"))  # no second replica: wait it out
            return replicas.first(one_ready, since=since) is not None

        outcomes = await load.run([
            bursts.Steady(rate=TRICKLE, seconds=4 * UP_WINDOW),
            bursts.Burst(concurrency=BURST, seconds=60, until=second_ready_and_measured),
            bursts.Burst(concurrency=AFTER, seconds=45, name="after", until=back_to_one),
            bursts.Quiet(seconds=1),
        ])

    queued = _queued(daemon)
    steady = [o for o in outcomes if o.phase == "steady"]
    burst = [o for o in outcomes if o.phase == "burst"]
    after = [o for o in outcomes if o.phase == "after"]
    print(f"\n{len(steady)} steady, {len(burst)} burst, {len(after)} after; "
          f"{len(replicas.samples)} status samples")
    assert not bursts.failures(outcomes), bursts.failures(outcomes)[:5]

    # The cap held the burst in the router's queue, as the autoscaler's waiting count.
    print(f"{queued[0]:g} requests waited in the router's queue, {queued[1]:.0f} s in all")
    assert queued[0] > 0

    # 1. Steady load below the target: one replica throughout, no change.
    assert replicas.most(steady[0].started, burst[0].started) == 1
    # The plan's own words: one scale-up for the burst, one scale-down after it, no other.
    decided = re.findall(rf"~ scale {scaledclusters.NAME} (\d) → (\d): (.*)",
                         daemon.log.read_text())
    print("\n".join(f"{a} → {b}: {why}" for a, b, why in decided))
    assert [(a, b) for a, b, _ in decided] == [("1", "2"), ("2", "1")], decided
    waiting = re.match(r"(\d+(?:\.\d+)?) waiting per replica", decided[0][2])
    assert waiting is not None and float(waiting.group(1)) > TARGET, decided[0]

    # 2. The burst places a second replica (none before it began), and TTFT falls.
    placed = replicas.first(lambda s: len(s.states) == 2)
    assert placed is not None and placed.at > burst[0].started, "no second replica placed"
    assert "ready" in marks, "the second replica never became ready"
    before = bursts.first_tokens([o for o in burst if o.started < placed.at])
    later = bursts.first_tokens([o for o in burst if o.started >= marks["ready"]])
    assert before and len(later) >= AFTER_READY
    ratio = bursts.percentile(later, 0.5) / bursts.percentile(before, 0.5)
    print(f"burst TTFT p50: {bursts.percentile(before, 0.5):.2f} s with one replica "
          f"({len(before)} requests), {bursts.percentile(later, 0.5):.2f} s with two "
          f"({len(later)}): ratio {ratio:.2f}")
    assert ratio < 1, "time to first token did not fall with the second replica"

    # 3. After the burst, one replica goes: no sooner than the windows allow, while both
    # hold streams (it drained: no request failed, checked above). The burst stopped
    # sending at its last request's start; what it had queued was served after that.
    stopped = max(o.started for o in burst)
    gone = replicas.first(one_ready, since=marks["ready"])
    assert gone is not None, "no replica stopped after the burst"
    assert gone.at - placed.at >= COOLDOWN
    assert gone.at - stopped >= DOWN_WINDOW
    assert len([o for o in after if o.started < gone.at]) >= AFTER, "no streams held"
    print(f"second replica: placed {placed.at - burst[0].started:.1f} s into the burst, "
          f"ready {marks['ready'] - placed.at:.1f} s later; one replica again "
          f"{gone.at - stopped:.1f} s after the burst's last request")


def _queued(daemon: daemons.Daemon) -> tuple[float, float]:
    """How many requests waited in the router's admission queue, and for how long in all."""
    text = httpx.get(f"{daemon.metrics}/metrics", timeout=10).text
    found = {}
    for part in ("count", "sum"):
        line = re.search(rf'^llmgw_router_queue_wait_seconds_{part}\{{model="'
                         rf'{scaledclusters.NAME}"\}} (\S+)$', text, re.M)
        found[part] = float(line.group(1)) if line else 0.0
    return found["count"], found["sum"]
