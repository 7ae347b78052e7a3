"""Every panel of every dashboard in deploy/grafana, evaluated by a real Prometheus scraping llmgw.

A real ``llmgw serve`` runs three simulated nodes (real sshd and agents: 8×
H100 on InfiniBand, 4× L40S, CPU only) with stand-in engines, and the
router. Debian's Prometheus scrapes its metrics listener every second. So
that each panel has something to show, the fleet lives a little:

* ``fetched`` is a URL source on a file server of this test (listed in
  ``weights.allowed_hosts``): its node's agent fetches it (fetch bytes, rate);
* ``tiny`` has a rollout gate, and a change that makes its engine answer in
  5 s fails the gate's 2 s probe: rolled back, held (gate verdicts, held);
* one of tiny's two engines is SIGKILLed under a burst of requests: those
  sent to it are retried on the other (retries; an engine-crash drift);
* chat's engine is stopped by hand with that class's repair off: held, and
  requests for chat wait for a replica and get 503 (waiting, 5xx, drift);
* a client sends completions, streamed and not, the whole time.

Then every target of every panel (variables set to the values Prometheus
has for them, ``$__rate_interval`` and friends substituted as Grafana does)
goes through ``/api/v1/query``: a parse error fails at once, and a query
still empty when the bound runs out fails, each naming the dashboard, the
panel and the expression. A misspelled expression is run through the same
check first, to show it is caught. Every process is gone at the end.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from ruamel.yaml import YAML
from support import dashboards, prometheus
from support.engines import MODELS, alive, recording, running
from support.pages import Server
from support.plugin import SimClusterFactory

pytestmark = pytest.mark.skipif(prometheus.BINARY is None,
                                reason="prometheus is not installed (make sysdeps)")

# Grafana's $__rate_interval is at least four scrape intervals; the range is the last minutes.
BUILTINS = {"__rate_interval": "15s", "__interval": "2s", "__range": "10m"}
GATE = {"probe": {"timeout": "2s"}, "bake": "0s"}


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[str]:
    """A file server on loopback holding ``weights.gguf``; its base URL."""
    root = tmp_path / "files"
    root.mkdir()
    (root / "weights.gguf").write_bytes(os.urandom(1 << 20))
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def models(file_server: str, tiny_args: dict[str, Any] | None = None) -> dict[str, Any]:
    found = recording(MODELS)
    found["tiny"]["scaling"] = {"min": 2, "max": 2}
    found["tiny"]["rollout"] = GATE
    if tiny_args:
        found["tiny"]["profiles"][0]["unchecked_args"] = tiny_args
    fetched = recording({"fetched": {
        "source": f"{file_server}/weights.gguf",
        "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1}]},
        # vLLM on a CPU node: its stand-in serves vLLM's /metrics families, KV cache
        # use among them (llama.cpp reports none), and it keeps running to the end.
        "kv": {"source": "/models/chat-8b",
               "profiles": [{"engine": "vllm", "cpu": True, "min_memory_gb": 1,
                             "args": {"max-model-len": 512,
                                      "kv-cache-memory-bytes": 67108864}}]}})
    return {**found, **fetched}


@pytest.fixture
def served(sim_cluster: SimClusterFactory, engines: Path, file_server: str,
           tmp_path: Path) -> Iterator[Server]:
    sim = sim_cluster(3)
    server = Server(sim.cluster_dir, tmp_path / "state", tmp_path / "serve.log")
    sim.write_cluster({"models": models(file_server), "cluster": {
        "sync": "auto", "drift_interval": "2s", "auth": "none",
        "store": {"path": str(tmp_path / "state" / "llmgw.db")},
        "listeners": server.listeners(),
        "weights": {"allowed_hosts": ["127.0.0.1"]},
        "drift": {"stopped_by_hand": {"repair": False}}}})
    # A fetch lands in a node's first weights directory: this test's, not the fixture's
    # (which is inside the package).
    weights = tmp_path / "weights"
    weights.mkdir()

    def fetch_here(spec: dict[str, Any]) -> None:
        for node in spec["nodes"].values():
            node["weights_dirs"] = [str(weights), *node.get("weights_dirs", [])]
    edit(sim.cluster_dir, fetch_here)
    server.start("--wait-timeout", "1s")
    try:
        yield server
    finally:
        server.stop()


class Traffic(threading.Thread):
    """Completions through the router, streamed and not, until stopped."""

    def __init__(self, router: str) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"{router}/v1", api_key="none", max_retries=0,
                                    timeout=30)
        self.stopping = threading.Event()
        self.answered = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            for model in ("tiny", "fetched", "chat", "no-such-model"):
                try:
                    if self.answered % 2:
                        for _ in self.client.completions.create(
                                model=model, prompt="hello there", max_tokens=4, stream=True):
                            pass
                    else:
                        self.client.completions.create(model=model, prompt="hello there",
                                                       max_tokens=4)
                    self.answered += 1
                except openai.APIError:
                    pass  # 503s for a held model and 404s are part of the figures
            self.stopping.wait(0.2)

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)


def settled(expected: dict[str, int]) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        ready: dict[str, int] = {}
        for replica in status["replicas"]:
            if replica["state"] == "ready":
                ready[replica["model"]] = ready.get(replica["model"], 0) + 1
        return ready == expected and not (status["plan"] or {}).get("has_changes", True)
    return check


def held(model: str, kind: str) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        return any(h["model"] == model and h["drift"] == kind
                   for h in (status["plan"] or {}).get("held") or [])
    return check


def scrape(server: Server) -> str:
    return httpx.get(f"{server.metrics}/metrics", timeout=5).text


def retry_once(server: Server, engines: Path) -> None:
    """SIGKILL one of tiny's engines under a burst of requests, until one was retried:
    a request sent to the dead engine before the route table drops it goes to the other."""
    def complete(client: httpx.Client) -> None:
        try:
            client.post(f"{server.router}/v1/completions",
                        json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        except httpx.HTTPError:
            pass  # the figures are what counts: a retry, or a 502 if none was possible

    with httpx.Client(timeout=30) as client:
        for _ in range(3):
            server.wait(settled({"chat": 1, "tiny": 2, "fetched": 1, "kv": 1}),
                        "tiny's two replicas ready", timeout=120)
            victim = next(data for name, data in alive(engines) if name == "tiny")
            os.killpg(victim["pgid"], signal.SIGKILL)
            burst = [threading.Thread(target=complete, args=(client,)) for _ in range(6)]
            for thread in burst:
                thread.start()
            for thread in burst:
                thread.join(60)
            if "llmgw_upstream_retries_total{" in scrape(server):
                return
    raise AssertionError("no request was retried after three of tiny's engines were killed")


def values_of(server: prometheus.Prometheus, board: dict[str, Any]) -> dict[str, list[str]]:
    """Each variable's values as Grafana's ``label_values`` would list them."""
    found = {}
    for variable in dashboards.variables(board):
        values = server.label_values(variable.label, variable.metric)
        assert values, f"variable {variable.name}: Prometheus has no {variable.label} values"
        found[variable.name] = values
    return found


def empty_queries(server: prometheus.Prometheus,
                  queries: list[tuple[dashboards.Query, str]]) -> list[str]:
    """The queries whose result is empty now; a query Prometheus refuses fails the test."""
    empty = []
    for query, expr in queries:
        try:
            result = server.query(expr)
        except prometheus.QueryError as exc:
            raise AssertionError(f"{query.where()}: Prometheus refuses it: {exc}\n"
                                 f"  expr: {query.expr}\n  sent: {expr}") from None
        if not result:
            empty.append(f"{query.where()}: empty result\n  expr: {query.expr}\n  sent: {expr}")
    return empty


def test_every_panel_of_every_dashboard_has_data_in_a_real_prometheus(
    served: Server, engines: Path, file_server: str, tmp_path: Path
) -> None:
    server = served
    server.wait(settled({"chat": 1, "tiny": 2, "fetched": 1, "kv": 1}), "every model ready",
                timeout=180)
    assert [p.name for p in (tmp_path / "weights").rglob("weights.gguf")] == ["weights.gguf"]
    traffic = Traffic(server.router)
    traffic.start()
    try:
        with prometheus.Prometheus(tmp_path / "prometheus",
                                   [server.metrics.removeprefix("http://")]) as prom:
            prom.wait_up()
            # A change that fails tiny's rollout gate: rolled back and held.
            write_models(server.directory, models(file_server, {"response-delay": 5}))
            server.until(lambda: 'llmgw_rollout_held{model="tiny"}' in scrape(server),
                         "tiny held after its gate failed", timeout=120)
            retry_once(server, engines)
            os.killpg(running(engines)["chat"]["pgid"], signal.SIGTERM)
            server.wait(held("chat", "stopped_by_hand"), "chat held, stopped by hand")

            # A misspelled name is reported as an empty result, and a broken expression
            # as refused, by the same check the dashboards go through.
            typo = dashboards.Query("typo.json", "Typo", "A", "sum(llmgw_node_reachabel)")
            assert empty_queries(prom, [(typo, typo.expr)]) == [
                "typo.json: panel 'Typo', target A: empty result\n"
                "  expr: sum(llmgw_node_reachabel)\n  sent: sum(llmgw_node_reachabel)"]
            broken = dashboards.Query("typo.json", "Broken", "A", "sum(llmgw_gpus")
            with pytest.raises(AssertionError, match="panel 'Broken', target A: Prometheus "
                               "refuses it: bad_data"):
                empty_queries(prom, [(broken, broken.expr)])

            queries: list[tuple[dashboards.Query, str]] = []
            for path in dashboards.files():
                board = dashboards.load(path)
                values = values_of(prom, board)
                for query in dashboards.queries([path]):
                    queries.append((query, dashboards.render(query.expr, values, BUILTINS)))
            assert len(queries) >= 40
            deadline = time.monotonic() + 90
            empty = empty_queries(prom, queries)
            while empty and time.monotonic() < deadline:
                time.sleep(1)
                empty = empty_queries(prom, queries)
            assert not empty, "\n".join(empty)
    finally:
        traffic.stop()
    assert traffic.answered > 0


def write_models(directory: Path, data: dict[str, Any]) -> None:
    """Replace the models of ``directory``'s cluster.yaml (the daemon watches the file)."""
    edit(directory, lambda spec: spec.update(models=data))


def edit(directory: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """Change ``directory``'s cluster.yaml in place, in one rename."""
    yaml = YAML(typ="safe")
    path = directory / "cluster.yaml"
    spec = yaml.load(path.read_text())
    change(spec)
    part = path.with_suffix(".part")
    with part.open("w") as out:
        yaml.dump(spec, out)
    part.replace(path)
