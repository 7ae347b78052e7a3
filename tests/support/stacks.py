"""A router in front of real upstream servers, on a loop in its own thread.

The official ``openai`` sync client blocks its thread, so the servers cannot
share the test's loop: :class:`Stack` runs upstreams, the router and its
metrics listener on a background loop and lets tests call into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from prometheus_client import CollectorRegistry
from support.upstream import Upstream

from llmgw.metrics import collectors, servers
from llmgw.router import Endpoint, Router, Settings, catalogs
from llmgw.spec.models import Cluster, StoreSettings
from llmgw.store import keys, stores, usages
from llmgw.web import Pages

T = TypeVar("T")
CPU = [{"engine": "llama.cpp", "cpu": True}]


def cluster(auth: str = "keys", **projects: float | None) -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab", "auth": auth},
        "models": {
            "chat": {"profiles": CPU, "scaling": {"min": 1, "max": 2},
                     "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}},
            "coder": {"profiles": CPU, "served_name": "Coder-7B",
                      "scaling": {"min": 0, "max": 1, "idle_timeout": "30m"}},
            "steady": {"profiles": CPU, "scaling": {"min": 1}},
        },
        "projects": {name: {"budget_usd": budget} for name, budget in
                     (projects or {"research": None}).items()},
    })


class Stack:
    def __init__(self, tmp: Path, spec: Cluster, settings: Settings, replicas: int,
                 store: dict[str, str] | None = None, *, pages: bool = False,
                 pages_options: Mapping[str, Any] | None = None) -> None:
        self.db_path = tmp / "llmgw.db"
        self.store_settings = StoreSettings.model_validate(store or {"path": str(self.db_path)})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.registry = CollectorRegistry()
        self.fleet = collectors.FleetCollector()
        self.registry.register(self.fleet)
        self.router = self.run(self._router(spec, settings))
        self.upstreams = [self.run(Upstream(f"u{i}").start()) for i in range(replicas)]
        extend = None
        if pages:  # the web pages on the router's listener, as `llmgw serve` has them
            # pages_options: Pages' keywords (a cluster that changes, a clock, a relying party)
            self.pages = Pages(self.router_store, self.router,
                               **{"cluster": lambda: spec, **(pages_options or {})})
            extend = self.pages.install
        self.runner = self.run(self.router.start("127.0.0.1", 0, extend=extend))
        self.metrics_runner = self.run(servers.start(self.registry, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.metrics_url = f"http://127.0.0.1:{servers.bound_port(self.metrics_runner)}/metrics"
        # A second handle on the same store, as `llmgw keys` would open it.
        self.db = self.run(stores.open_store(self.store_settings))

    async def _router(self, spec: Cluster, settings: Settings) -> Router:
        self.router_store = await stores.open_store(self.store_settings)
        return Router(catalogs.from_cluster(spec), store=self.router_store,
                      registry=self.registry, settings=settings)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        async def call() -> T:
            return fn(*args)
        return self.run(call())

    def route(self, table: Mapping[str, list[Upstream | str]]) -> None:
        """Point models at upstreams (or raw URLs, e.g. a closed port)."""
        endpoints = {
            model: [Endpoint(u.url if isinstance(u, Upstream) else u, "local", i)
                    for i, u in enumerate(targets)]
            for model, targets in table.items()
        }
        self.call(self.router.update_routes, endpoints)

    def key(self, project: str = "research") -> str:
        return self.run(keys.create(self.db, project)).secret

    def rows(self) -> list[usages.UsageRow]:
        self.run(self.router.accounts.flush())
        return self.run(usages.recent(self.db, 1000))

    def table_values(self, table: str) -> list[str]:
        """Every value in ``table`` as text, read with SQL straight from the database."""
        assert table in ("usage", "keys", "users", "sessions", "messages", "audit_log")
        if self.db.kind == "sqlite":
            with contextlib.closing(sqlite3.connect(self.db_path)) as conn:
                return [str(v) for row in conn.execute(f"SELECT * FROM {table}") for v in row]

        async def fetch() -> list[str]:
            settings = self.store_settings
            target = stores.target_of(settings.url, "", settings.password_file)
            conn = await asyncpg.connect(target.dsn)
            try:
                return [str(v) for row in await conn.fetch(f"SELECT * FROM {table}") for v in row]
            finally:
                await conn.close()
        return self.run(fetch())

    def close(self) -> None:
        self.run(self.router.close(self.runner))
        self.run(self.metrics_runner.cleanup())
        for upstream in self.upstreams:
            self.run(upstream.stop())
        self.run(self.router_store.close())
        self.run(self.db.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


StackFactory = Callable[..., Stack]
