"""The router's own metrics: requests, latency, time to first token, tokens, in flight.

All instruments live on one :class:`prometheus_client.CollectorRegistry`
passed in (never the global default), so tests and several routers in one
process do not collide. Label children are cached per (model, status) so a
request pays a dict lookup, not prometheus-client's label validation.

Usage::

    registry = CollectorRegistry()
    m = instruments.RouterMetrics(registry)
    m.finished("llama", 200, seconds=0.8)
"""

from __future__ import annotations

import contextlib
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Request latency spans a cached embedding (ms) to a long generation (minutes).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

UNKNOWN_MODEL = "-"
"""Label for requests naming no known model: clients must not mint label values."""


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llmgw_requests", "Requests answered by the router, by model and HTTP status.",
            ["model", "status"], registry=registry,
        )
        self.latency = Histogram(
            "llmgw_request_duration_seconds",
            "Time from receiving a request to sending the last byte of its answer.",
            ["model"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.ttft = Histogram(
            "llmgw_time_to_first_token_seconds",
            "Streaming requests: time from receiving the request to sending the first event.",
            ["model"], buckets=TTFT_BUCKETS, registry=registry,
        )
        self.tokens = Counter(
            "llmgw_tokens", "Tokens reported by engines' usage, by model and kind.",
            ["model", "kind"], registry=registry,
        )
        # multiprocess_mode tells `--workers` how to add the workers' gauges up (ignored in
        # one process): requests in flight and waiting sum over live workers; every worker
        # holds the same route table, so its size is the largest any reports.
        self.in_flight = Gauge(
            "llmgw_requests_in_flight", "Requests being proxied now.", ["model"],
            registry=registry, multiprocess_mode="livesum",
        )
        self.retries = Counter(
            "llmgw_upstream_retries",
            "Requests retried on another replica after a failure before the first byte.",
            ["model"], registry=registry,
        )
        self.engine_errors = Counter(
            "llmgw_engine_errors",
            "Engines' 5xx answers by whose fault they are (client: the request, answered "
            "400; server: the engine) and the recognised reason (router/faults.py).",
            ["model", "status", "fault", "reason"], registry=registry,
        )
        self.waiting = Gauge(
            "llmgw_requests_waiting", "Requests waiting for a model to have a ready replica.",
            ["model"], registry=registry, multiprocess_mode="livesum",
        )
        self.queue_depth_gauge = Gauge(
            "llmgw_router_queue_depth",
            "Requests in the model's admission queue: every ready replica is at its cap.",
            ["model"], registry=registry, multiprocess_mode="livesum",
        )
        self.queue_wait_hist = Histogram(
            "llmgw_router_queue_wait_seconds",
            "Time a request waited in the model's admission queue (requests that waited; "
            "one that timed out counts its whole queue_timeout).",
            ["model"], buckets=QUEUE_BUCKETS, registry=registry,
        )
        self.endpoints = Gauge(
            "llmgw_router_endpoints", "Ready endpoints in the router's route table, by model.",
            ["model"], registry=registry, multiprocess_mode="max",
        )
        self.rate_limited_total = Counter(
            "llmgw_rate_limited",
            "Requests refused 429 rate_limit_exceeded, by project and the limit's kind "
            "(requests: rpm, tokens: tpm), a project's own or one of its keys'.",
            ["project", "kind"], registry=registry,
        )
        # Upstreams (``upstreams:``): label values are names from the cluster files only.
        self.upstream_up = Gauge(
            "llmgw_upstream_up", "1 while the upstream answers its health probe, else 0 "
            "(down, not probed yet, or its key file unreadable).",
            ["upstream"], registry=registry, multiprocess_mode="livemax",
        )
        self.upstream_requests = Counter(
            "llmgw_upstream_requests", "Attempts sent to an upstream (a retry is an attempt).",
            ["upstream"], registry=registry,
        )
        self.upstream_failures = Counter(
            "llmgw_upstream_failures", "Attempts on an upstream that failed: a 5xx, a failed "
            "connection, no first byte in time, a stream cut short.",
            ["upstream"], registry=registry,
        )
        self.upstream_duration = Histogram(
            "llmgw_upstream_request_duration_seconds",
            "Time from sending an attempt to an upstream to its end.",
            ["upstream"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.store_up = Gauge(
            "llmgw_router_store_up", "1 while the router's last store call succeeded; 0 "
            "during an outage (known keys keep working: docs/ha.md).",
            registry=registry, multiprocess_mode="min",
        )
        self.store_up.set(1)
        self.buffered_rows = Gauge(
            "llmgw_router_usage_buffered_rows", "Usage rows not yet written to the store "
            "(on the router's disk or in memory).", registry=registry,
            multiprocess_mode="livesum",
        )
        self.key_lookups = Counter(
            "llmgw_router_key_cache", "API key checks by whether the key was cached (hit) "
            "or read from the store (miss).", ["result"], registry=registry,
        )
        self._multiprocess = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        self._endpoint_models: set[str] = set()
        self._requests: dict[tuple[str, int], Counter] = {}
        self._latency: dict[str, Histogram] = {}
        self._ttft: dict[str, Histogram] = {}
        self._in_flight: dict[str, Gauge] = {}
        self._tokens: dict[str, tuple[Counter, Counter]] = {}

    def started(self, model: str) -> None:
        child = self._in_flight.get(model)
        if child is None:
            child = self._in_flight[model] = self.in_flight.labels(model)
        child.inc()

    def ended(self, model: str) -> None:
        self._in_flight[model].dec()

    def finished(self, model: str, status: int, seconds: float) -> None:
        key = (model, status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.requests.labels(model, str(status))
        counter.inc()
        hist = self._latency.get(model)
        if hist is None:
            hist = self._latency[model] = self.latency.labels(model)
        hist.observe(seconds)

    def engine_error(self, model: str, status: int, fault: str, reason: str) -> None:
        self.engine_errors.labels(model, str(status), fault, reason).inc()

    def first_token(self, model: str, seconds: float) -> None:
        hist = self._ttft.get(model)
        if hist is None:
            hist = self._ttft[model] = self.ttft.labels(model)
        hist.observe(seconds)

    def rate_limited(self, project: str, kind: str) -> None:
        self.rate_limited_total.labels(project, kind).inc()

    def signal(self, name: str, value: float) -> None:
        """The accounts' outage figures (llmgw.router.accounts)."""
        if name == "store_up":
            self.store_up.set(value)
        elif name == "buffered_rows":
            self.buffered_rows.set(value)
        elif name in ("key_hit", "key_miss"):
            self.key_lookups.labels("hit" if name == "key_hit" else "miss").inc(value)

    def queue_depth(self, model: str, depth: int) -> None:
        self.queue_depth_gauge.labels(model).set(depth)

    def queue_wait(self, model: str, seconds: float) -> None:
        self.queue_wait_hist.labels(model).observe(seconds)

    def used_tokens(self, model: str, prompt: int | None, completion: int | None) -> None:
        children = self._tokens.get(model)
        if children is None:
            children = self._tokens[model] = (
                self.tokens.labels(model, "prompt"), self.tokens.labels(model, "completion"))
        if prompt:
            children[0].inc(prompt)
        if completion:
            children[1].inc(completion)

    def upstream_state(self, name: str, up: bool) -> None:
        self.upstream_up.labels(name).set(1 if up else 0)
        self.upstream_requests.labels(name)  # 0 from the start: a rate needs a first sample
        self.upstream_failures.labels(name)

    def upstream_request(self, name: str, failed: bool, seconds: float) -> None:
        self.upstream_requests.labels(name).inc()
        if failed:
            self.upstream_failures.labels(name).inc()
        self.upstream_duration.labels(name).observe(seconds)

    def drop_upstream(self, name: str) -> None:
        """An upstream gone from the cluster files: its series go (where they can)."""
        for metric in (self.upstream_up, self.upstream_requests, self.upstream_failures,
                       self.upstream_duration):
            with contextlib.suppress(KeyError):
                metric.remove(name)

    def set_endpoints(self, counts: dict[str, int]) -> None:
        """Replace the per-model endpoint gauge; models gone from the table disappear
        (in `--workers` mode, where prometheus-client cannot remove a series, they read 0)."""
        if self._multiprocess:
            for model in self._endpoint_models - set(counts):
                self.endpoints.labels(model).set(0)
            self._endpoint_models = set(counts)
        else:
            self.endpoints.clear()
        for model, count in counts.items():
            self.endpoints.labels(model).set(count)
