"""The router: one OpenAI-compatible endpoint in front of every model.

:class:`Router` holds the state the daemon talks to — ``routes`` (the table it
updates after each observation), ``demand()`` (what it reads back for
scaling), ``configure(catalog)`` (after a spec reload) — and
``create_app()`` builds the aiohttp application clients reach.

Usage::

    router = Router(catalogs.from_cluster(cluster), store=await stores.open_store(settings),
                    registry=registry)
    router.routes.update({"llama": [Endpoint("http://10.0.0.11:18000")]})
    runner = await router.start("127.0.0.1", 8000)
    ...
    await router.close(runner)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry

from llmgw.fleet.types import Demand
from llmgw.metrics.instruments import UNKNOWN_MODEL, RouterMetrics
from llmgw.router import (
    accounts,
    affinities,
    connections,
    errors,
    loras,
    permissions,
    ratelimits,
    streams,
)
from llmgw.router.accounts import NOTHING, Accounts, Principal, Reservation
from llmgw.router.admissions import Admissions
from llmgw.router.catalogs import Catalog, ModelEntry
from llmgw.router.demands import Demands
from llmgw.router.errors import ApiError
from llmgw.router.externals import Externals
from llmgw.router.proxies import Outcome, Proxy
from llmgw.router.requestids import RequestIds
from llmgw.router.routes import Endpoint, Routes
from llmgw.store import usages
from llmgw.store.stores import Store, StoreError
from llmgw.store.usages import UsageRow

log = logging.getLogger(__name__)

PROXIED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
# Endpoints whose streams carry token usage only when asked for it.
_ASK_FOR_USAGE = ("/v1/chat/completions", "/v1/completions")
CLIENT_CLOSED = 499  # nginx's code for "the client went away before the answer"


@dataclass(frozen=True)
class Settings:
    wait_timeout: float = 10.0  # how long a request waits for a loading model
    retry_after: int = 10  # seconds, in the Retry-After of "model is loading"
    max_body_bytes: int = 32 * 2**20  # requests above this get 413
    connect_timeout: float = 5.0  # to a replica; a failure is retried on another one
    # Seconds between usage-row writes: short, so each write is a small batch that does not
    # stall the loop (a 1 s batch at 5k req/s is a visible pause in p99).
    flush_interval: float = 0.2
    # To the engine's first byte (headers of a plain answer, first event of a stream),
    # for routes without a model in the catalog; models set their own (routing.first_byte_timeout).
    first_byte_timeout: float = 600.0
    header_timeout: float = 15.0  # a connection's request line and headers; idle keep-alive too
    body_timeout: float = 60.0  # a request's whole body, once its headers arrived
    max_connections: int = 4096  # open client connections; more get 503 and are closed
    # Seconds between heartbeats: this router's reservations are released, and what its
    # requests recorded billed, (3 + 1) intervals after it stops beating (llmgw.router.heartbeats).
    heartbeat_interval: float = 5.0
    # Where usage rows wait for a store that cannot be reached (llmgw.router.usagebuffers);
    # None: in memory only.
    state_dir: Path | None = None


class Router:
    def __init__(
        self,
        catalog: Catalog,
        *,
        store: Store | None = None,
        registry: CollectorRegistry | None = None,
        settings: Settings | None = None,
        router_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or Settings()
        self.catalog = catalog
        self.routes = Routes()
        self.demands = Demands(watched_since=time.time())
        # ``clock``: Unix time stamping usage rows, starting budget periods and rate windows
        # (tests move it).
        self.metrics = RouterMetrics(registry if registry is not None else CollectorRegistry())
        self.accounts = Accounts(store, catalog, self.settings.flush_interval, router_id,
                                 self.settings.heartbeat_interval, clock,
                                 self.settings.state_dir, self.metrics.signal)
        self.admissions = Admissions(self.routes.free)
        self.limits = ratelimits.RateLimiter(store, clock=clock,
                                             refused=self.metrics.rate_limited)
        # Upstreams llmgw did not place: merged into the replicas' table here, never
        # published (their keys stay in this process).
        self._replicas: Mapping[str, Sequence[Endpoint]] = {}
        self.externals = Externals(self.metrics, changed=self._reroute)
        self.externals.configure(catalog.upstreams)
        self.proxy = Proxy(self.routes, self.settings.connect_timeout,
                           freed=self._freed, externals=self.externals)
        self.store = store
        self._request_ids = RequestIds()
        self.started_at = int(time.time())
        # Who is asking when a request has no Authorization header: the pages' session
        # (llmgw.web installs it). It returns None for "no session" and raises ApiError
        # for a session request without its CSRF token.
        self.page_auth: Callable[[web.Request], Awaitable[Principal | None]] | None = None

    def configure(self, catalog: Catalog) -> None:
        """Use a new spec's models, prices, budgets and auth mode from now on."""
        self.catalog = catalog
        self.accounts.catalog = catalog
        self.admissions.configure({e.key: e.max_in_flight for e in catalog.models.values()})
        self.externals.configure(catalog.upstreams)

    def update_routes(self, model_to_endpoints: Mapping[str, Sequence[Endpoint]]) -> None:
        """The replicas' table (``routes.update``, with the upstreams that are up merged
        in) plus the endpoint gauge; what the daemon should call.

        Call it on the router's event loop (the daemon's loop): the table is not locked.
        """
        self._replicas = model_to_endpoints
        self._reroute()

    def _reroute(self) -> None:
        """The table again: the replicas' and the upstreams' that are up."""
        table = {model: list(endpoints) for model, endpoints in self._replicas.items()}
        for model, endpoints in self.externals.endpoints().items():
            table.setdefault(model, []).extend(endpoints)
        self.routes.update(table)
        self.metrics.set_endpoints(self.routes.counts())
        self.admissions.pump_all()  # a new replica, or one gone: queues may move

    def set_others(self, replica_in_flight: Mapping[str, int]) -> None:
        """Other routers' requests in flight by replica URL (their merged demand records):
        balancing and caps count them from now on."""
        self.routes.set_others(replica_in_flight)
        self.admissions.pump_all()

    def demand(self) -> Demand:
        return self.demands.snapshot(
            queued=self.admissions.depths(), in_flight=self.routes.in_flight(),
            replica_in_flight=self.routes.replica_in_flight())

    def _freed(self, model: str) -> None:
        if self.admissions.pump(model):
            self.metrics.queue_depth(model, self.admissions.depth(model))

    def tallies(self) -> dict[str, dict[str, Any]]:
        """Per-replica requests, errors, TTFT and in-flight counts (rollout gates)."""
        return self.routes.tallies.snapshot()

    def models(self) -> list[str]:
        """Served names a client may ask for now (what GET /v1/models lists)."""
        return self._listed()

    def create_app(
        self, extend: Callable[[web.Application], None] | None = None
    ) -> web.Application:
        """The application; ``extend`` adds more routes (the pages) before it is frozen."""
        app = web.Application(
            middlewares=[_openai_errors], client_max_size=self.settings.max_body_bytes
        )
        for path in PROXIED:
            app.router.add_post(path, self._proxied)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._model)
        app.router.add_get("/health", _health)
        app.router.add_get("/ready", self._ready)
        app.on_startup.append(self._on_startup)
        app.on_response_prepare.append(_rate_headers)
        app.on_cleanup.append(self._on_cleanup)
        if extend is not None:
            extend(app)
        return app

    async def start(
        self, host: str, port: int, reuse_port: bool = False,
        extend: Callable[[web.Application], None] | None = None,
    ) -> web.AppRunner:
        """Serve on ``host:port`` (0: any free port); a client hanging up cancels its request.

        ``reuse_port``: SO_REUSEPORT, so several router processes share the port.
        ``extend``: add more routes (the pages) to the application. Connections are
        bounded (see :mod:`llmgw.router.connections`): headers within
        ``header_timeout``, at most ``max_connections`` open, parse errors answered
        in OpenAI's shape and logged without a byte of the request.
        """
        settings = self.settings
        runner = connections.runner(self.create_app(extend),
                                    header_timeout=settings.header_timeout,
                                    max_connections=settings.max_connections)
        await runner.setup()
        await web.TCPSite(runner, host, port, backlog=1024, reuse_port=reuse_port or None).start()
        return runner

    async def close(self, runner: web.AppRunner | None = None) -> None:
        if runner is not None:
            await runner.cleanup()
        await self.proxy.close()
        await self.externals.close()
        await self.accounts.close()

    async def _on_startup(self, _: web.Application) -> None:
        await self.accounts.start()
        await self.externals.start()
        if self.store is not None:
            # Last use survives a restart: an idle decision must not start from nothing.
            try:
                for model, used in (await usages.last_use_by_model(self.store)).items():
                    self.demands.touch(model, used)
            except StoreError as exc:
                log.error("cannot restore the models' last use from the store: %s", exc)

    async def _on_cleanup(self, _: web.Application) -> None:
        await self.proxy.close()
        await self.externals.close()
        await self.accounts.close()

    # -- handlers ---------------------------------------------------------------------

    async def _proxied(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        # Its usage row's ts and its budget period: a request is billed when it arrived;
        # and its rate window is the minute it arrived in, by the limiter's clock (the same
        # clock unless a test pins one), so a request near midnight is in one day for both.
        arrived, minute_at = self.accounts.clock(), self.limits.clock()
        label, entry_key, principal, name = UNKNOWN_MODEL, None, None, None
        stream, body_bytes, estimated, reservation = False, 0, 0.0, NOTHING
        outcome, tokens = Outcome(), 0
        ticket: ratelimits.Ticket | None = None
        try:
            principal = await self._principal(request)
            body = await _read_body(request, self.settings.max_body_bytes,
                                    self.settings.body_timeout)
            payload = _parse(body)
            name = payload["model"]
            permissions.check(self.catalog, principal.project, name)  # before it is looked up
            entry, entry_key = self._resolve(name)
            label = entry_key
            body_bytes = len(body)
            self.metrics.started(label)
            try:
                self.demands.touch(entry_key, time.time())
                stream = payload.get("stream") is True
                if entry is not None:
                    body, payload = loras.rewrite(body, payload, entry.adapter,
                                                  entry.listed_adapters)
                    _check_choices(payload)
                    prompt, output = accounts.estimate(body_bytes, payload,
                                                       request.path == "/v1/embeddings",
                                                       entry.context_tokens)
                    estimated = entry.cost(prompt, output)
                    if principal.project is not None:
                        tokens = prompt + output
                        ticket = await self._limit(request, principal, tokens, minute_at)
                        reservation = await self.accounts.reserve(
                            principal, estimated, entry_key, request.path, stream, arrived)
                        self.accounts.track(reservation, _produced(outcome, body_bytes, entry))
                strip = False
                if stream and request.path in _ASK_FOR_USAGE:
                    body, asked = streams.ask_for_usage(body, payload)
                    strip = not asked
                affinity = None
                if entry is not None and entry.prefix_chars:
                    affinity = affinities.key(payload, entry.prefix_chars, entry.min_prefix_chars)
                await self._wait_for_replica(name, entry_key, entry)
                if entry is not None and entry.max_in_flight is not None:
                    await self._admit(entry, principal)
                response = await self.proxy.forward(
                    request, entry_key, body, stream=stream, strip_usage_chunk=strip,
                    outcome=outcome, on_retry=lambda: self.metrics.retries.labels(label).inc(),
                    affinity=affinity, load_factor=entry.load_factor if entry else 1.25,
                    first_byte_timeout=(entry.first_byte_timeout if entry
                                        else self.settings.first_byte_timeout),
                    cap=entry.max_in_flight if entry else None,
                    replicas_only=entry is not None and entry.adapter is not None,
                )
                outcome.status = outcome.status or response.status
                return response
            finally:
                self.metrics.ended(label)
        except ApiError as error:
            outcome.status = error.status
            return error.response()
        except asyncio.CancelledError:
            # A client that hangs up after its answer's last event (the openai SDK closes
            # on [DONE]) was served: its status stays the engine's.
            if not outcome.complete:
                outcome.status = CLIENT_CLOSED
            raise
        except ConnectionResetError:
            # The client hung up while we wrote to it. aiohttp's attempt to send this
            # answer fails quietly on the closed transport; raising would log a traceback.
            if not outcome.complete:
                outcome.status = CLIENT_CLOSED
            return web.Response(status=outcome.status)
        finally:
            self.accounts.untrack(reservation)
            cost = self._account(request.path, label, entry_key, principal, stream, outcome,
                                 started, body_bytes, estimated, reservation, name, arrived)
            await self.accounts.settle(reservation, cost)
            await self.limits.settle(ticket, _tokens_used(outcome, body_bytes, tokens))

    async def _limit(self, request: web.Request, principal: Principal,
                     tokens: int, now: float) -> ratelimits.Ticket | None:
        """Count the request against its project's and key's rates (ApiError 429 when one
        is full); the answer carries the ``x-ratelimit-*`` headers."""
        assert principal.project is not None
        rpm, tpm = self.catalog.rates.get(principal.project, (None, None))
        ticket = await self.limits.admit(ratelimits.limits_of(
            principal.project, principal.key_id, rpm, tpm, principal.rpm, principal.tpm),
            tokens, now)
        if ticket is not None:
            request[_RATE_HEADERS] = ticket.headers
        return ticket

    async def _principal(self, request: web.Request) -> Principal:
        authorization = request.headers.get("Authorization")
        if authorization is None and self.page_auth is not None:
            principal = await self.page_auth(request)
            if principal is not None:
                return principal
        return await self.accounts.authenticate(authorization)

    def _resolve(self, name: str) -> tuple[ModelEntry | None, str]:
        entry = self.catalog.models.get(name)
        if entry is not None:
            return entry, entry.key
        if self.routes.has(name):  # static routes (tests) or a model the spec just dropped
            return None, name
        raise ApiError(404, f"model not found: {name!r} is not served here; GET /v1/models "
                       "lists the models", code="model_not_found", param="model")

    async def _admit(self, entry: ModelEntry, principal: Principal) -> None:
        """Wait in the model's admission queue while every replica is at its cap."""
        key = entry.key
        project = principal.project or principal.user or ""
        admissions = self.admissions
        try:
            waited = await admissions.admit(key, project, cap=entry.max_in_flight,
                                            limit=entry.queue_limit,
                                            timeout=entry.queue_timeout)
        except ApiError as error:
            if error.code == "queue_timeout":
                self.metrics.queue_wait(key, entry.queue_timeout)
            raise
        finally:
            self.metrics.queue_depth(key, admissions.depth(key))
        if waited is not None:
            self.metrics.queue_wait(key, waited)

    async def _wait_for_replica(self, name: str, key: str, entry: ModelEntry | None) -> None:
        if self.routes.has(key):
            if entry is not None and entry.on_demand and not self.routes.has_replica(key):
                self.demands.served_elsewhere(key, time.time())  # an upstream serves it
            return
        self.demands.wait_started(key)
        self.metrics.waiting.labels(key).inc()
        try:
            ready = await self.routes.wait_ready(key, self.settings.wait_timeout)
        finally:
            self.demands.wait_ended(key)
            self.metrics.waiting.labels(key).dec()
        if ready:
            return
        after = self.settings.retry_after
        if entry is not None and entry.on_demand:
            message = (f"model is loading: {name!r} is started on demand and has no ready "
                       f"replica yet; retry in {after} s")
        else:
            message = (f"model {name!r} has no ready replica (starting, or failed: see "
                       f"`llmgw status`); retry in {after} s")
        down = self.externals.down(key)
        if down:
            message = (f"model {name!r} has no ready replica and no upstream that is up "
                       f"({'; '.join(down)}); retry in {after} s")
        raise ApiError(503, message, code="model_loading", type="server_error",
                       headers={"Retry-After": str(after)})

    def _account(
        self,
        path: str,
        label: str,
        key: str | None,
        principal: Principal | None,
        stream: bool,
        outcome: Outcome,
        started: float,
        body_bytes: int = 0,
        estimated: float = 0.0,
        reservation: Reservation = NOTHING,
        served: str | None = None,
        arrived: float | None = None,
    ) -> float:
        """Metrics and the usage row of a finished request; returns what it cost.

        ``served`` is the name the request asked for: an adapter's has its own prices."""
        ended = time.monotonic()
        status = outcome.status or 500
        self.metrics.finished(label, status, ended - started)
        for fault in outcome.engine_errors:
            self.metrics.engine_error(label, fault.status, fault.fault, fault.reason)
        if outcome.first_byte_at is not None:
            self.metrics.first_token(label, outcome.first_byte_at - started)
            if key is not None:
                self.demands.first_token(key, outcome.first_byte_at - started, time.time())
        if key is None or principal is None:
            return 0.0  # no model resolved: nothing to charge, no row
        entry = self.catalog.priced(key, served)
        usage = outcome.usage
        cost = None
        if usage is None and (outcome.relayed or (outcome.sent and status == CLIENT_CLOSED)):
            # The client left (or the engine broke) before the usage chunk: charge what
            # was served, the prompt included, since the engine read it.
            usage = accounts.unreported(body_bytes, outcome.relayed)
        elif usage is None and outcome.sent and 200 <= status < 300:
            cost = estimated  # an answer whose usage cannot be read: the most it could cost
        prompt, completion = usage or (None, None)
        self.metrics.used_tokens(label, prompt, completion)
        if cost is None:
            cost = entry.cost(prompt, completion) if entry else 0.0
        self.accounts.record(UsageRow(
            ts=self.accounts.clock() if arrived is None else arrived,
            project=principal.project, key_id=principal.key_id, model=key,
            endpoint=path, status=status, prompt_tokens=prompt, completion_tokens=completion,
            latency_ms=round((ended - started) * 1000, 3), cost_usd=cost, stream=stream,
            user_name=principal.user, upstream=outcome.upstream,
            request_id=self._request_ids.next(),
        ), reservation)
        return cost

    async def _models(self, request: web.Request) -> web.Response:
        principal = await self.accounts.authenticate(request.headers.get("Authorization"))
        names = permissions.listed(self.catalog, [principal.project], self._listed())
        return _json({"object": "list", "data": [self._model_card(name) for name in names]})

    async def _model(self, request: web.Request) -> web.Response:
        principal = await self.accounts.authenticate(request.headers.get("Authorization"))
        name = request.match_info["model"]
        if name not in permissions.listed(self.catalog, [principal.project], self._listed()):
            raise ApiError(404, f"model not found: {name!r}", code="model_not_found")
        return _json(self._model_card(name))

    def _listed(self) -> list[str]:
        """Served names of models with a ready replica, plus on-demand ones."""
        names = set()
        for key in self.routes.models():
            entry = self.catalog.by_key(key)
            names.add(entry.served_name if entry else key)
            names.update(self.catalog.adapters(key))
        names.update(name for name, e in self.catalog.models.items() if e.on_demand)
        return sorted(names)

    def _model_card(self, name: str) -> dict[str, Any]:
        card = {"id": name, "object": "model", "created": self.started_at, "owned_by": "llmgw"}
        entry = self.catalog.models.get(name)
        if entry is not None and entry.adapter is not None:
            # As vLLM lists its adapters, but `root` is the base's name: a node path
            # is nothing a client can use.
            card.update(parent=entry.adapter.parent, root=entry.adapter.parent)
        return card

    async def _ready(self, _: web.Request) -> web.Response:
        models = self.routes.models()
        if not models:
            return _json({"status": "not ready", "reason": "no model has a ready replica"}, 503)
        return _json({"status": "ready", "models": models})


async def _health(_: web.Request) -> web.Response:
    return _json({"status": "ok"})


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(doc).encode(),
                        content_type="application/json")


async def _read_body(request: web.Request, limit: int, timeout: float) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body is {request.content_length} bytes; the limit is "
                       f"{limit}", code="request_too_large")
    try:
        if request.content.is_eof():  # all of it came with the headers: nothing to wait on
            return await request.read()
        async with asyncio.timeout(timeout):
            return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"request body exceeds the limit of {limit} bytes",
                       code="request_too_large") from exc
    except TimeoutError as exc:
        raise ApiError(408, f"request body not received within {timeout:g} s",
                       code="request_timeout") from exc
    except (aiohttp.ClientPayloadError, HttpProcessingError) as exc:
        # A malformed body (bad chunk size, ...): say which kind, never echo its bytes.
        raise ApiError(400, f"malformed request body ({type(exc).__name__})",
                       code="invalid_request") from exc


def _parse(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except RecursionError as exc:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from exc
    except ValueError as exc:
        # The position only: the decoder's message quotes no input, but keep it that way.
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else ""
        raise ApiError(400, f"request body is not valid JSON{where}",
                       code="invalid_json") from exc
    if not isinstance(payload, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "you must provide a model parameter (a string)",
                       code="missing_model", param="model")
    # Only JSON booleans: "true" or 1 would stream at some engines while the router, not
    # seeing a stream, neither asks for usage nor reads it.
    if payload.get("stream") is not None and not isinstance(payload["stream"], bool):
        raise ApiError(400, "stream must be a boolean (true or false)",
                       code="invalid_type", param="stream")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", code="invalid_type",
                       param="stream_options")
    return payload


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/v1/"):
            raise  # redirects, and the pages' own errors (llmgw.web renders those)
        return errors.from_http(exc).response()


_RATE_HEADERS = web.RequestKey("llmgw.rate_headers", dict)


async def _rate_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The admission's ``x-ratelimit-*`` headers on the answer, streams included (added
    as its headers are sent, whichever module sends them)."""
    found = request.get(_RATE_HEADERS)
    if found:
        response.headers.update(found)


def _tokens_used(outcome: Outcome, body_bytes: int, estimate: int) -> int:
    """What a request used, for its tokens per minute: the engine's usage; what was served
    when it ended early; its estimate when a success's usage cannot be read; nothing when
    it never reached an engine. As :meth:`Router._account` charges it."""
    if outcome.usage is not None:
        return (outcome.usage[0] or 0) + (outcome.usage[1] or 0)
    if outcome.relayed or (outcome.sent and outcome.status == CLIENT_CLOSED):
        return sum(accounts.unreported(body_bytes, outcome.relayed))
    if outcome.sent and 200 <= (outcome.status or 500) < 300:
        return estimate
    return 0


def _check_choices(payload: dict[str, Any]) -> None:
    """``n`` above OpenAI's own limit is refused: each choice is a whole answer to pay for."""
    n = payload.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > accounts.MAX_CHOICES:
        raise ApiError(400, f"n must be at most {accounts.MAX_CHOICES}; got {n}",
                       code="invalid_value", param="n")


def _produced(outcome: Outcome, body_bytes: int,
              entry: ModelEntry) -> Callable[[], tuple[int, int, float]]:
    """What a request has produced so far, for its reservation's record (the heartbeat
    reads it): nothing before it reached an engine; then its prompt and one token per
    stream event relayed, as :func:`accounts.unreported` charges a cut stream."""
    def produced() -> tuple[int, int, float]:
        if not outcome.sent:
            return 0, 0, 0.0
        events = outcome.relay.events if outcome.relay is not None else outcome.relayed
        if outcome.usage is not None:
            prompt, completion = outcome.usage[0] or 0, outcome.usage[1] or 0
        else:
            prompt, completion = accounts.unreported(body_bytes, events)
        return prompt, completion, entry.cost(prompt, completion)
    return produced
