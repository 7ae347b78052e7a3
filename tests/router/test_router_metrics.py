"""Metrics on their own listener: router figures, fleet figures, valid for promtool."""

from __future__ import annotations

import shutil
import subprocess

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.stacks import Stack

from llmgw.fleet.types import Fleet, Gpu, GpuProcess, NodeReport, Unit
from llmgw.metrics import collectors


def gpu(index: int, **fields: object) -> Gpu:
    return Gpu.model_validate({"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100",
                               "gpu_class": "h100-80g", **fields})


def unit(model: str, replica: int, rank: int, state: str) -> Unit:
    return Unit(name=f"llmgw-{model}-r{replica}-s{rank}.service", model=model, replica=replica,
                rank=rank, digest="d", state=state)  # type: ignore[arg-type]


FLEET = Fleet(nodes={
    "gpu-a-01": NodeReport(node="gpu-a-01", gpus=[
        gpu(0, utilization_pct=87, memory_used_mib=70000,
            processes=[GpuProcess(pid=10, owned_by_llmgw=True)]),
        gpu(1),  # reported neither utilisation nor memory: no sample, not a zero
        gpu(2, ecc_uncorrected=3),
        gpu(3, processes=[GpuProcess(pid=99, name="python")]),  # someone else's
    ], units=[unit("llama", 0, 0, "ready"), unit("llama", 0, 1, "loading"),
              unit("qwen", 0, 0, "ready")]),
    "gpu-a-02": NodeReport(node="gpu-a-02", reachable=False, error="timed out",
                           units=[unit("qwen", 1, 0, "ready")]),
})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


async def scrape(stack: Stack) -> str:
    async with aiohttp.ClientSession() as session, session.get(stack.metrics_url) as response:
        assert response.status == 200
        return await response.text()


def test_fleet_figures() -> None:
    collector = collectors.FleetCollector()
    # eight fleet families, nine of engines, GPUs, fabrics and GPUs held, then the two drift
    # families (llmgw.metrics.drifts)
    assert [len(f.samples) for f in collector.collect()] == [0] * 19
    collector.observe(FLEET)
    found = {(f.name, tuple(sorted(s.labels.items()))): s.value
             for f in collector.collect() for s in f.samples}
    c = "h100-80g"
    assert found[("llmgw_gpus", (("gpu_class", c), ("state", "used")))] == 1
    assert found[("llmgw_gpus", (("gpu_class", c), ("state", "free")))] == 1
    assert found[("llmgw_gpus", (("gpu_class", c), ("state", "faulty")))] == 2
    assert found[("llmgw_node_reachable", (("node", "gpu-a-01"),))] == 1
    assert found[("llmgw_node_reachable", (("node", "gpu-a-02"),))] == 0
    utilization = {k[1]: v for k, v in found.items() if k[0] == "llmgw_gpu_utilization_ratio"}
    assert utilization == {(("gpu", "0"), ("gpu_class", c), ("node", "gpu-a-01")): 0.87}
    memory = {k[1] for k in found if k[0] == "llmgw_gpu_memory_used_bytes"}
    assert memory == {(("gpu", "0"), ("gpu_class", c), ("node", "gpu-a-01"))}
    replicas = {k[1]: v for k, v in found.items() if k[0] == "llmgw_replicas"}
    assert replicas == {
        (("model", "llama"), ("state", "loading")): 1,  # one shard still loading
        (("model", "qwen"), ("state", "ready")): 1,
        (("model", "qwen"), ("state", "unknown")): 1,  # its node did not answer
    }


async def test_scrape_passes_promtool(stack: Stack) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool missing: `make sysdeps` installs Debian's prometheus package")
    stack.fleet.observe(FLEET)
    c = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    await c.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    stream = await c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True)
    _ = [chunk async for chunk in stream]
    with pytest.raises(openai.NotFoundError):
        await c.chat.completions.create(model="nope", messages=[])
    await c.close()

    text = await scrape(stack)
    check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    assert check.stdout.decode().strip() == "" and check.stderr.decode().strip() == ""

    found = samples(text)
    assert found[("llmgw_requests_total", (("model", "chat"), ("status", "200")))] == 2
    # An unknown model name does not become a label value: clients cannot mint series.
    assert found[("llmgw_requests_total", (("model", "-"), ("status", "404")))] == 1
    assert found[("llmgw_tokens_total", (("kind", "completion"), ("model", "chat")))] == 8
    assert found[("llmgw_time_to_first_token_seconds_count", (("model", "chat"),))] == 1
    assert found[("llmgw_request_duration_seconds_count", (("model", "chat"),))] == 2
    assert found[("llmgw_requests_in_flight", (("model", "chat"),))] == 0
    assert found[("llmgw_router_endpoints", (("model", "chat"),))] == 2
    assert found[("llmgw_gpus", (("gpu_class", "h100-80g"), ("state", "faulty")))] == 2
