"""A real two-shard vLLM replica across two nodes, and what happens when one rank dies.

``nodes: 2, tensor_parallel: 2`` on two simulated CPU nodes, each with its
own agent: the planner places rank 0 on node-01 and rank 1 on node-02, each
agent starts its rank's unit with the rendered argv (``--nnodes 2
--node-rank R --master-addr 127.0.0.1 --master-port P``, ``--headless`` on
rank 1), the ranks meet over loopback, and rank 0 answers only once rank 1
has joined: then the router serves the replica. Killing rank 1's engine
breaks the replica (its ranks rendezvous once, at start); the planner
classes the crash and replaces the replica as a whole, and the router
serves the new one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import vllmharness as vh
from support.plugin import SimClusterFactory

# vLLM imports torch and much else: minutes on two shared cores, per engine start.
pytestmark = [pytest.mark.skipif(not vh.VLLM.exists(), reason=vh.MISSING),
              pytest.mark.timeout(vh.TEST_TIMEOUT)]
NAME = "split"


@pytest.fixture
def served(sim_cluster: SimClusterFactory, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[vh.Served]:
    vh.patient_agents(monkeypatch)
    sim = sim_cluster(2, hardware=["cpu-only"])
    vh.install(sim)
    daemon = vh.Served(sim, tmp_path / "serve.log")
    yield daemon
    daemon.stop()


def models(source: Path) -> dict[str, Any]:
    # 130 GiB of the fixture nodes' 251: one replica per node pair, so that a
    # replacement stops the broken replica before it starts the new one (this
    # machine has no room for four vLLM processes at once).
    return {NAME: {"source": str(source), "scaling": {"min": 1, "max": 1},
                   "profiles": [vh.profile(nodes=2, tensor_parallel=2, min_memory_gb=130)]}}


def test_a_two_node_vllm_replica_serves_and_is_replaced_whole_when_a_rank_dies(
    served: vh.Served, tmp_path: Path,
) -> None:
    source = vh.build_model(tmp_path / "model")
    served.write(models(source))
    started = time.monotonic()
    served.start()
    served.wait(vh.ready(NAME, shards=2), "both ranks ready")
    print(f"two-shard vLLM ready {time.monotonic() - started:.0f} s after `llmgw serve` started")

    (head_node, head), (follower_node, follower) = served.units(NAME)
    assert (head_node, head.rank, follower_node, follower.rank) == ("node-01", 0, "node-02", 1)
    assert head.pid is not None and follower.pid is not None
    rank0, rank1 = vh.served_argv(head), vh.served_argv(follower)
    for rank, rendered, pid in ((0, rank0, head.pid), (1, rank1, follower.pid)):
        assert vh.argv(pid)[2:] == rendered[2:], (rank, vh.argv(pid))
        assert rendered[rendered.index("--node-rank") + 1] == str(rank)
        assert rendered[rendered.index("--nnodes") + 1] == "2"
        assert rendered[rendered.index("--master-addr") + 1] == "127.0.0.1"
        assert vh.environment(pid)["VLLM_HOST_IP"] == "127.0.0.1"
    assert "--headless" in rank1 and "--port" not in rank1 and "--headless" not in rank0
    assert rank0[rank0.index("--master-port") + 1] == rank1[rank1.index("--master-port") + 1]
    print(f"RSS: rank 0 {vh.rss_mib(head.pid)} MiB, rank 1 {vh.rss_mib(follower.pid)} MiB")

    client = openai.OpenAI(base_url=f"{served.router}/v1", api_key="unused", max_retries=0,
                           timeout=300)
    completion = client.completions.create(model=NAME, prompt="Hello", max_tokens=8)
    assert completion.usage is not None and completion.usage.completion_tokens > 0

    # Rank 1 dies: the whole replica is replaced, on both nodes.
    vh.kill(follower.pid)
    status = served.wait(lambda s: vh.ready(NAME, shards=2)(s) and vh.gone(head.pid)
                         and all(u.replica != head.replica for _, u in served.units(NAME)),
                         "the replica replaced as a whole")
    print("after the kill:", status["last_apply"])
    (_, new_head), (_, new_follower) = served.units(NAME)
    assert new_head.pid not in (None, head.pid) and new_follower.pid not in (None, follower.pid)
    again = client.completions.create(model=NAME, prompt="Hello", max_tokens=8)
    assert again.usage is not None and again.usage.completion_tokens > 0
