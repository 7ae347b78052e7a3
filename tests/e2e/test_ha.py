"""High availability end to end: two reconcilers and two routers on a real PostgreSQL.

Real processes (``llmgw serve --role ...``), real sshd nodes and agents, stand-in
engines, the official ``openai`` client streaming through both routers.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import daemons
from support.engines import MODELS, recording, running
from support.plugin import SimClusterFactory
from support.postgres import Database

from llmgw.spec.models import StoreSettings
from llmgw.store import keys, stores, usages, users

LEASE_TTL = 3.0


class Proc(daemons.Daemon):
    """One ``llmgw serve`` process of some role, with its own listeners and log.

    ``router``, ``admin`` and ``metrics`` are ``host:port`` here, as ``--*-listen`` takes them.
    """

    def __init__(self, directory: Path, role: str, log: Path, *extra: str) -> None:
        super().__init__(directory, log)
        self.role = role
        listen = self.listeners()
        self.router, self.admin, self.metrics = listen["router"], listen["admin"], listen["metrics"]
        self.start("--role", role, "--router-listen", self.router, "--admin-listen", self.admin,
                   "--metrics-listen", self.metrics, "--ready-timeout", "60s",
                   "--log-level", "debug", *extra)

    def status(self) -> dict[str, Any]:
        return httpx.get(f"http://{self.admin}/api/v1/status", timeout=5,  # type: ignore[no-any-return]
                         headers=self.auth()).json()

    def ready(self, where: str) -> int:
        return httpx.get(f"http://{where}/ready", timeout=5).status_code

    def wait(self, check: Callable[[], bool], what: str,  # type: ignore[override]
             timeout: float = 90) -> None:
        self.until(check, f"{what} ({self.role})", timeout)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:  # type: ignore[override]
        super().stop(timeout=30)


class Clients:
    """Threads streaming chat completions through the given routers, round robin."""

    def __init__(self, routers: list[str], key: str, threads: int = 4) -> None:
        self.routers = routers
        self.key = key
        self.done = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        clients = [openai.OpenAI(base_url=f"http://{r}/v1", api_key=self.key, max_retries=0,
                                 timeout=30) for r in self.routers]
        n = index
        while not self._stop.is_set():
            client = clients[n % len(clients)]
            n += 1
            try:
                chunks = list(client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True))
                assert chunks, "an empty stream"
                with self._lock:
                    self.done += 1
            except Exception as exc:  # every failure is a finding, whatever its kind
                with self._lock:
                    self.failures.append(f"{client.base_url}: {exc!r}")

    def wait_for(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        target = self.done + count
        while self.done < target:
            assert time.monotonic() < deadline, f"clients stalled at {self.done}"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@pytest.fixture
def ha(sim_cluster: SimClusterFactory, engines: Path, postgres_db: Database,
       tmp_path: Path) -> Iterator[Callable[..., tuple[Path, str]]]:
    """A cluster on PostgreSQL with one CPU node; returns (directory, an API key)."""
    procs: list[Proc] = []

    def make(budget: float | None = None, lease_ttl: float = LEASE_TTL) -> tuple[Path, str]:
        sim = sim_cluster(1, hardware=("cpu-only",))
        directory = sim.write_cluster({
            "cluster": {"sync": "auto", "drift_interval": "1s", "auth": "keys",
                        "lease_ttl": f"{lease_ttl}s", "store": postgres_db.settings},
            "models": recording({"tiny": {**MODELS["tiny"], "pricing": {
                "input_per_mtok": 1.0, "output_per_mtok": 1.0}}}),
            "projects": {"research": {"budget_usd": budget}},
        })
        return directory, asyncio.run(_key(postgres_db))

    make.procs = procs  # type: ignore[attr-defined]
    yield make
    for proc in procs:
        proc.stop()


async def _key(db: Database) -> str:
    store = await stores.open_store(StoreSettings.model_validate(db.settings))
    try:
        return (await keys.create(store, "research")).secret
    finally:
        await store.close()


def start(ha: Any, directory: Path, role: str, name: str, *extra: str) -> Proc:
    proc = Proc(directory, role, directory.parent / f"{name}.log", *extra)
    ha.procs.append(proc)
    return proc


def leading(proc: Proc) -> bool:
    return bool(proc.status()["leadership"]["leading"])


def tiny_ready(proc: Proc) -> bool:
    status = proc.status()
    return any(r["model"] == "tiny" and r["state"] == "ready" for r in status["replicas"]) \
        and not (status["plan"] or {}).get("has_changes", True)


def test_kill_the_leader_while_clients_stream_through_two_routers(
        ha: Any, engines: Path) -> None:
    directory, key = ha()
    first = start(ha, directory, "reconciler", "reconciler-a")
    first.wait(lambda: leading(first) and tiny_ready(first), "a leader with tiny ready")
    second = start(ha, directory, "reconciler", "reconciler-b")
    second.wait(lambda: second.ready(second.admin) == 503 and
                second.status()["leadership"]["leader"] is not None, "a standby")
    assert not leading(second)
    routers = [start(ha, directory, "router", f"router-{i}") for i in (1, 2)]
    for router in routers:
        router.wait(lambda r=router: r.ready(r.router) == 200, "routes from the leader")
    engines_before = {name: data["pid"] for name, data in running(engines).items()}
    assert set(engines_before) == {"tiny"}

    clients = Clients([r.router for r in routers], key)
    try:
        clients.wait_for(8)
        killed_at = time.monotonic()
        first.kill()
        second.wait(lambda: leading(second), "the standby to lead", timeout=LEASE_TTL * 10)
        took_over = time.monotonic() - killed_at
        second.wait(lambda: second.status()["leadership"]["first_iteration_at"] is not None
                    and tiny_ready(second), "the new leader's first iteration")
        assert second.ready(second.admin) == 200
        clients.wait_for(8)  # and more requests after the hand-over
    finally:
        clients.stop()
    print(f"new leader {took_over:.2f}s after kill -9 (lease_ttl {LEASE_TTL}s); "
          f"{clients.done} streamed requests, {len(clients.failures)} failed")
    assert clients.failures == []
    # Adopted, not restarted: the same engine process, and the new leader changed nothing.
    assert {name: data["pid"] for name, data in running(engines).items()} == engines_before
    status = second.status()
    assert status["last_apply"] is None and status["leadership"]["epoch"] == 2
    # Who leads, as `llmgw status` and the metrics say it.
    holder = status["leadership"]["holder"]
    shown = subprocess.run([sys.executable, "-m", "llmgw", "status", "--cluster",
                            str(directory)], capture_output=True, text=True, timeout=60)
    assert f"leader: {holder} (epoch 2, lease" in shown.stdout, shown
    metrics = httpx.get(f"http://{second.metrics}/metrics", timeout=5).text
    assert f'llmgw_reconciler_leading{{holder="{holder}"}} 1.0' in metrics


def test_a_clean_stop_hands_the_lease_over_at_once(ha: Any, engines: Path) -> None:
    # A minute of lease: were it not handed over, the standby could not lead for 40 s
    # or more (the leader renews every 20 s), longer than this test waits.
    directory, _ = ha(lease_ttl=60)
    first = start(ha, directory, "reconciler", "reconciler-a")
    first.wait(lambda: leading(first) and tiny_ready(first), "a leader with tiny ready")
    second = start(ha, directory, "reconciler", "reconciler-b")
    second.wait(lambda: second.status()["leadership"]["leader"] is not None, "a standby")
    engine = running(engines)["tiny"]["pid"]
    first.stop()  # SIGTERM
    assert first.process.returncode == 0
    second.wait(lambda: leading(second) and tiny_ready(second), "the hand-over", timeout=30)
    assert "released the lease" in first.log.read_text()
    assert running(engines)["tiny"]["pid"] == engine


def test_a_routers_admin_shows_the_leaders_fleet_and_then_the_new_leaders(
    ha: Any, engines: Path, postgres_db: Database,
) -> None:
    """Routers have no loop of their own: /admin shows the leader's published summary,
    with its holder and age, and after a ``kill -9`` of the leader the new leader's."""
    directory, _ = ha()
    first = start(ha, directory, "reconciler", "reconciler-a")
    first.wait(lambda: leading(first) and tiny_ready(first), "a leader with tiny ready")
    second = start(ha, directory, "reconciler", "reconciler-b")
    second.wait(lambda: second.status()["leadership"]["leader"] is not None, "a standby")
    router = start(ha, directory, "router", "router")
    router.wait(lambda: router.ready(router.router) == 200, "routes from the leader")
    asyncio.run(_admin_user(postgres_db.settings))
    [node] = first.status()["nodes"]
    base = f"http://{router.router}"
    with httpx.Client(timeout=10) as client:
        _login(client, base)

        def shows(holder: str) -> bool:
            page = client.get(f"{base}/admin")
            assert page.status_code == 200, page.text
            return (f"summary from {holder} (leader), " in page.text and " s old" in page.text
                    and "tiny" in page.text and node in page.text
                    and "has not observed the fleet" not in page.text)

        leader = first.status()["leadership"]["holder"]
        router.wait(lambda: shows(leader), f"/admin with the summary of {leader}", timeout=30)
        # The reconcilers' admin listener points to the pages instead of asking for a token.
        elsewhere = httpx.get(f"http://{first.admin}/admin", timeout=5)
        assert elsewhere.status_code == 404 and "served by routers" in elsewhere.text
        first.kill()
        successor = second.status()["leadership"]["holder"]
        second.wait(lambda: leading(second), "the standby leading", timeout=30)
        router.wait(lambda: shows(successor), f"/admin with the summary of {successor}",
                    timeout=30)


def test_router_workers_of_one_machine_show_the_parents_summary_on_sqlite(
    sim_cluster: SimClusterFactory, engines: Path,
) -> None:
    """``--role all --workers 2``: the loop runs in the parent, /admin in the workers."""
    sim = sim_cluster(1, hardware=("cpu-only",))
    directory = sim.write_cluster({"cluster": {"sync": "auto", "drift_interval": "1s"},
                                   "models": recording({"tiny": MODELS["tiny"]})})
    settings = {"path": str(directory / "llmgw.db")}
    proc = Proc(directory, "all", directory.parent / "all.log", "--workers", "2")
    try:
        proc.wait(lambda: tiny_ready(proc), "tiny ready")
        proc.wait(lambda: proc.ready(proc.router) == 200, "routes in a worker")
        asyncio.run(_admin_user(settings))
        holder = proc.status()["leadership"]["holder"]
        with httpx.Client(timeout=10) as client:
            _login(client, f"http://{proc.router}")
            proc.wait(lambda: f"summary from {holder} (leader), " in client.get(
                f"http://{proc.router}/admin").text, "/admin in a worker")
    finally:
        proc.stop()


ADA = "ada-admin-pass-for-ha"


def _login(client: httpx.Client, base: str) -> None:
    form = client.get(f"{base}/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token is not None
    answer = client.post(f"{base}/login", data={"name": "ada", "password": ADA,
                                                 "csrf": token.group(1)})
    assert answer.status_code == 303, answer.text


async def _admin_user(settings: dict[str, str]) -> None:
    store = await stores.open_store(StoreSettings.model_validate(settings))
    try:
        await users.create(store, "ada", ADA, admin=True)
    finally:
        await store.close()


def test_kill_a_router_and_the_other_keeps_serving(ha: Any, engines: Path) -> None:
    directory, key = ha()
    leader = start(ha, directory, "reconciler", "reconciler")
    leader.wait(lambda: leading(leader) and tiny_ready(leader), "tiny ready")
    routers = [start(ha, directory, "router", f"router-{i}") for i in (1, 2)]
    for router in routers:
        router.wait(lambda r=router: r.ready(r.router) == 200, "routes from the leader")
    clients = Clients([routers[1].router], key, threads=2)
    try:
        clients.wait_for(3)
        routers[0].kill()
        clients.wait_for(10)
    finally:
        clients.stop()
    assert clients.failures == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{routers[0].router}/health", timeout=2)


def test_routers_keep_routing_while_no_leader_answers(ha: Any, engines: Path) -> None:
    directory, key = ha()
    leader = start(ha, directory, "reconciler", "reconciler")
    leader.wait(lambda: leading(leader) and tiny_ready(leader), "tiny ready")
    router = start(ha, directory, "router", "router")
    router.wait(lambda: router.ready(router.router) == 200, "routes from the leader")
    leader.kill()  # no reconciler at all now
    client = openai.OpenAI(base_url=f"http://{router.router}/v1", api_key=key, max_retries=0)
    for _ in range(5):
        assert client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}]).choices
    # A router started while no leader runs gets the last published routes from the store.
    late = start(ha, directory, "router", "router-late")
    late.wait(lambda: late.ready(late.router) == 200, "the last published routes")


def test_usage_from_two_routers_lands_in_one_store(
        ha: Any, engines: Path, postgres_db: Database) -> None:
    directory, key = ha()
    leader = start(ha, directory, "reconciler", "reconciler")
    leader.wait(lambda: leading(leader) and tiny_ready(leader), "tiny ready")
    routers = [start(ha, directory, "router", f"router-{i}") for i in (1, 2)]
    for router in routers:
        router.wait(lambda r=router: r.ready(r.router) == 200, "routes")
    clients = Clients([r.router for r in routers], key)
    try:
        clients.wait_for(20)
    finally:
        clients.stop()
    for router in routers:
        router.stop()  # flushes its rows
    rows = asyncio.run(_rows(postgres_db))
    assert clients.failures == [] and len(rows) == clients.done
    assert {r.key_id for r in rows} == {keys.key_id_of(key)}
    # A client that closes as soon as it reads [DONE] (the openai SDK) was served whole:
    # 200, never 499 (router/proxies.py ends a stream at its last event).
    assert {r.status for r in rows} == {200}


def test_two_router_workers_share_one_port_and_one_metrics_view(
        ha: Any, engines: Path) -> None:
    directory, key = ha()
    leader = start(ha, directory, "reconciler", "reconciler")
    leader.wait(lambda: leading(leader) and tiny_ready(leader), "tiny ready")
    pool = start(ha, directory, "router", "routers", "--workers", "2")
    pool.wait(lambda: pool.ready(pool.router) == 200, "routes in a worker")
    workers = [int(p) for p in Path(f"/proc/{pool.process.pid}/task/{pool.process.pid}/children")
               .read_text().split()]
    assert len(workers) == 2
    for _ in range(40):  # a new connection each: the kernel spreads them over the workers
        reply = httpx.post(f"http://{pool.router}/v1/chat/completions", timeout=30,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        assert reply.status_code == 200, reply.text
    metrics = httpx.get(f"http://{pool.metrics}/metrics", timeout=5).text
    # Both workers' counters, summed into one series by the parent.
    assert 'llmgw_requests_total{model="tiny",status="200"} 40.0' in metrics, metrics
    assert metrics.count('llmgw_requests_total{model="tiny",status="200"}') == 1
    # And both served some: each worker's counter file holds its own share.
    environ = Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
    shared = Path(next(v for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
                  .split(b"=", 1)[1].decode())
    assert {f"counter_{pid}.db" for pid in workers} <= {p.name for p in shared.iterdir()}


def test_migrate_sqlite_to_postgresql_under_the_daemon(
        sim_cluster: SimClusterFactory, engines: Path, postgres_db: Database,
        tmp_path: Path) -> None:
    sim = sim_cluster(1, hardware=("cpu-only",))
    cluster = {"sync": "auto", "drift_interval": "1s", "auth": "keys",
               "store": {"path": "llmgw.db"}}
    sections = {"models": recording({"tiny": MODELS["tiny"]}),
                "projects": {"research": {}}}
    directory = sim.write_cluster({"cluster": cluster, **sections})
    key = asyncio.run(_key_in(StoreSettings(path=str(directory / "llmgw.db"))))
    daemon = Proc(directory, "all", tmp_path / "serve.log")
    try:
        daemon.wait(lambda: tiny_ready(daemon), "tiny ready on SQLite")
        engine = running(engines)["tiny"]["pid"]
        clients = Clients([daemon.router], key, threads=2)
        try:
            clients.wait_for(5)
            moved = subprocess.run(  # while the daemon serves and writes usage
                [sys.executable, "-m", "llmgw", "store", "migrate", "--cluster", str(directory),
                 "--to", postgres_db.url, "--password-file", str(postgres_db.password_file)],
                capture_output=True, text=True, timeout=120)
            assert moved.returncode == 0, moved.stderr
            assert "copied 1 key, " in moved.stdout
            clients.wait_for(5)
        finally:
            clients.stop()
        daemon.stop()
        served_on_sqlite = clients.done
        sim.write_cluster({"cluster": {**cluster, "store": postgres_db.settings}, **sections})
        daemon = Proc(directory, "all", tmp_path / "serve.log")
        daemon.wait(lambda: tiny_ready(daemon), "tiny ready on PostgreSQL")
        topped = subprocess.run(  # the rows written after the copy, before the switch
            [sys.executable, "-m", "llmgw", "store", "migrate", "--cluster", str(directory),
             "--to", postgres_db.url, "--password-file", str(postgres_db.password_file)],
            capture_output=True, text=True, timeout=120)
        # The cluster's store is PostgreSQL now: migrating into itself is refused ...
        assert topped.returncode == 1 and "the store copied from" in topped.stderr
        topped = subprocess.run(  # ... so the old file is named with --from
            [sys.executable, "-m", "llmgw", "store", "migrate", "--cluster", str(directory),
             "--from", f"sqlite://{directory / 'llmgw.db'}", "--to", postgres_db.url,
             "--password-file", str(postgres_db.password_file)],
            capture_output=True, text=True, timeout=120)
        assert topped.returncode == 0 and "topped up 0 keys, " in topped.stdout, topped
        clients = Clients([daemon.router], key, threads=2)  # the same key, on PostgreSQL
        try:
            clients.wait_for(5)
        finally:
            clients.stop()
        daemon.stop()
    finally:
        daemon.stop()
    assert clients.failures == []
    assert running(engines)["tiny"]["pid"] == engine  # adopted across the restart
    rows = asyncio.run(_rows(postgres_db))
    assert len(rows) == served_on_sqlite + clients.done


async def _key_in(settings: StoreSettings) -> str:
    store = await stores.open_store(settings)
    try:
        return (await keys.create(store, "research")).secret
    finally:
        await store.close()


async def _rows(db: Database) -> list[usages.UsageRow]:
    store = await stores.open_store(StoreSettings.model_validate(db.settings))
    try:
        return await usages.recent(store, 100000)
    finally:
        await store.close()


