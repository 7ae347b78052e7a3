"""High availability costs, measured side by side in one run.

1. **Router on each store.** ``llmgw serve --role router`` processes in front of
   one fast mock upstream, with the store on SQLite and on a real PostgreSQL
   (the Debian package, started here in a temporary directory), with one worker
   and with two (``--workers 2``, SO_REUSEPORT). Every request checks its key in
   the store and reserves its budget there (the project has a budget), and every
   usage row is written: the HA path. Requests/s at ``--connections`` keep-alive
   clients (wrk), latency p50/p99 at one client, and what the router adds over
   calling the upstream directly. Rounds interleave the rows; each figure is the
   best of ``--rounds``.
2. **Failover.** Two ``llmgw serve --role reconciler`` on PostgreSQL with
   ``lease_ttl`` ``--ttl``; ``kill -9`` of the leader at a random point of its
   renewal cycle; time until the standby has finished its first iteration as
   leader (its first apply: observe, plan, apply), ``--failovers`` times.

``--pin``: wrk and the upstream run on the last CPU (``taskset``), a 1-worker router
on CPU 0 and a 2-worker router on CPUs 0 and 1, so ``--workers`` is measured with the
load generator kept off the router's first core (on a 2-CPU machine the second worker
shares its CPU with wrk: the figure is a bound). ``--only routers`` skips the failovers.

Numbers are printed, never asserted.

    .venv/bin/python tests/bench/ha.py [--duration 2] [--rounds 3] [--connections 32]
        [--pin] [--only routers]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

_spec = importlib.util.spec_from_file_location("bench_router", ROOT / "tests/bench/router.py")
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_router"] = bench  # dataclasses look their module up while defining
_spec.loader.exec_module(bench)

from support import postgres  # noqa: E402

from llmgw.daemon.leaders import LEASE  # noqa: E402
from llmgw.spec import statedirs  # noqa: E402
from llmgw.spec.models import StoreSettings  # noqa: E402
from llmgw.store import keys, stores  # noqa: E402

BODY = bench.BODY


def cluster_yaml(store: dict[str, str], lease_ttl: float = 15) -> str:
    return json.dumps({
        "cluster": {"name": "bench", "auth": "keys", "store": store, "sync": "auto",
                    "lease_ttl": f"{lease_ttl}s", "drift_interval": "60s"},
        "models": {"bench": {"profiles": [{"engine": "llama.cpp", "cpu": True}],
                             "source": "/models/bench.gguf",
                             "pricing": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}},
        "projects": {"bench": {"budget_usd": 1e9}},  # a budget: every request reserves
    })


async def prepare(settings: dict[str, str], upstream: int) -> str:
    """A key, and the routes a leader would publish (the upstream as model `bench`)."""
    store = await stores.open_store(StoreSettings.model_validate(settings))
    try:
        secret = (await keys.create(store, "bench")).secret
        grant = await store.acquire_lease(LEASE, "bench", 3600)
        assert grant is not None
        doc = json.dumps({"routes": {"bench": [[f"http://127.0.0.1:{upstream}", "local", 0]]}})
        assert await store.publish_routes(LEASE, "bench", grant.epoch, doc)
        await store.release_lease(LEASE, "bench")
        return secret
    finally:
        await store.close()


def wait_ready(url: str, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


def routers(args: argparse.Namespace, tmp: Path, pg: postgres.PgServer,
            running: contextlib.ExitStack, upstream: int) -> list[Any]:
    targets = [bench.Target("direct", f"http://127.0.0.1:{upstream}")]
    variants = [(kind, workers, None) for kind in ("sqlite", "postgresql") for workers in (1, 2)]
    if args.baseline:  # another version's llmgw package, 1 worker, for a before/after
        variants += [(kind, 1, args.baseline) for kind in ("sqlite", "postgresql")]
    for kind, workers, baseline in variants:
        name = f"{kind}, {workers} worker{'s' if workers > 1 else ''}"
        name += " (baseline)" if baseline else ""
        directory = tmp / (f"{kind}-{workers}" + ("-baseline" if baseline else ""))
        directory.mkdir()
        settings = ({"path": str(directory / "llmgw.db")} if kind == "sqlite"
                    else pg.database().settings)
        (directory / "cluster.yaml").write_text(cluster_yaml(settings))
        key = asyncio.run(prepare(settings, upstream))
        port = bench.free_port()
        pin = (["taskset", "-c", ",".join(str(c) for c in range(workers))]
               if args.pin else [])
        argv = [*pin, sys.executable, "-m", "llmgw", "serve", "--cluster", str(directory),
                "--role", "router", "--workers", str(workers), "--log-level", "warning",
                "--router-listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{bench.free_port()}"]
        # `-m` puts the working directory first on sys.path: it picks the package.
        running.enter_context(bench.process(argv, port, cwd=baseline or ROOT))
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        targets.append(bench.Target(name, url, key))
    return targets


def measure(targets: list[Any], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for target in targets:
        bench.wrk(target.url, BODY, target.key, args.connections, 1, tmp)  # warm
    for _ in range(args.rounds):
        for target in targets:
            m = bench.measure_once(target, "plain", args, tmp)
            best = results.get(target.name)
            results[target.name] = m if best is None else bench.Measure(
                max(best.rps, m.rps), min(best.p50_us, m.p50_us), min(best.p99_us, m.p99_us))
    return results


def failovers(args: argparse.Namespace, tmp: Path, pg: postgres.PgServer) -> list[float]:
    import httpx

    directory = tmp / "failover"
    directory.mkdir()
    database = pg.database()
    (directory / "cluster.yaml").write_text(cluster_yaml(database.settings, args.ttl))
    times: list[float] = []

    def start(name: str) -> tuple[subprocess.Popen[bytes], str]:
        admin = f"127.0.0.1:{bench.free_port()}"
        log = (tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "serve", "--cluster", str(directory), "--role",
             "reconciler", "--admin-listen", admin, "--metrics-listen",
             f"127.0.0.1:{bench.free_port()}", "--log-level", "info"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT,
            env={**os.environ, statedirs.ENV: str(tmp)})  # the admin token: in tmp
        return proc, admin

    def status(admin: str) -> dict[str, Any]:
        token = (tmp / statedirs.ADMIN_TOKEN).read_text().strip()
        return httpx.get(f"http://{admin}/api/v1/status", timeout=5,  # type: ignore[no-any-return]
                         headers={"Authorization": f"Bearer {token}"}).json()

    def wait(check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, FileNotFoundError):
                if check():
                    return
            time.sleep(0.02)
        raise RuntimeError("timed out")

    leader = start("reconciler-0")
    wait(lambda: status(leader[1])["leadership"]["first_iteration_at"] is not None, 60)
    for n in range(args.failovers):
        standby = start(f"reconciler-{n + 1}")
        wait(lambda s=standby: status(s[1])["leadership"]["leader"] is not None, 60)
        time.sleep(random.uniform(0, args.ttl / 3))  # anywhere in the renewal cycle
        killed = time.time()
        leader[0].send_signal(signal.SIGKILL)
        leader[0].wait()
        wait(lambda s=standby: status(s[1])["leadership"]["first_iteration_at"] is not None,
             args.ttl * 4)
        times.append(status(standby[1])["leadership"]["first_iteration_at"] - killed)
        leader = standby
    leader[0].send_signal(signal.SIGTERM)
    leader[0].wait(30)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per figure (best)")
    parser.add_argument("--connections", type=int, default=32, help="concurrent clients")
    parser.add_argument("--ttl", type=float, default=5.0, help="lease_ttl for the failovers")
    parser.add_argument("--failovers", type=int, default=3, help="leader kills")
    parser.add_argument("--pin", action="store_true",
                        help="taskset: wrk and the upstream on the last CPU, routers from CPU 0")
    parser.add_argument("--only", choices=("routers",), help="skip the failovers")
    parser.add_argument("--baseline", metavar="DIR",
                        help="add 1-worker rows for the llmgw package in DIR (another "
                             "version, e.g. `git archive` of a commit), for before/after")
    args = parser.parse_args()
    last = f"{(os.cpu_count() or 1) - 1}"
    if args.pin:
        bench.WRK_PREFIX[:] = ["taskset", "-c", last]
    if not shutil.which("wrk") or postgres.bindir() is None:
        print("skipped: wrk or PostgreSQL not installed (`make sysdeps`)")
        return 0
    load = os.getloadavg()[0]
    pg = postgres.PgServer()
    try:
        with tempfile.TemporaryDirectory(prefix="llmgw-bench-ha-") as tmpdir, \
                contextlib.ExitStack() as running:
            tmp = Path(tmpdir)
            os.chmod(tmp, 0o755)
            up = bench.free_port()
            running.enter_context(bench.process(
                [*bench.WRK_PREFIX, sys.executable, str(ROOT / "tests/support/upstream.py"),
                 "--port", str(up)], up))
            results = measure(routers(args, tmp, pg, running, up), args, tmp)
            times = [] if args.only else failovers(args, tmp, pg)
    finally:
        pg.stop()
    direct = results["direct"]
    pinned = (f"; pinned: wrk and upstream on CPU {last}, routers from CPU 0"
              if args.pin else "")
    print(f"wrk, 1 thread; req/s at {args.connections} connections, latency at 1 connection; "
          f"best of {args.rounds} x {args.duration:g}s; {os.cpu_count()} CPUs, load "
          f"{load:.1f} before{pinned}\n")
    print("| router (store, processes) | req/s | p50 ms | p99 ms | adds at p50 ms |")
    print("|---|--:|--:|--:|--:|")
    for name, m in results.items():
        added = "" if name == "direct" else f"{(m.p50_us - direct.p50_us) / 1000:.3f}"
        print(f"| {name} | {m.rps:,.0f} | {m.p50_us / 1000:.3f} | {m.p99_us / 1000:.3f} | "
              f"{added} |")
    sqlite1, pg1 = results["sqlite, 1 worker"], results["postgresql, 1 worker"]
    if args.baseline:
        before = (results["postgresql, 1 worker (baseline)"].rps
                  / results["sqlite, 1 worker (baseline)"].rps)
        print(f"\nbaseline: PostgreSQL / SQLite, 1 worker: {before:.2f}x req/s")
    print(f"\nPostgreSQL / SQLite, 1 worker: {pg1.rps / sqlite1.rps:.2f}x req/s; "
          f"2 workers / 1 worker: SQLite {results['sqlite, 2 workers'].rps / sqlite1.rps:.2f}x,"
          f" PostgreSQL {results['postgresql, 2 workers'].rps / pg1.rps:.2f}x")
    if not times:
        return 0
    print(f"\nfailover, lease_ttl {args.ttl:g}s, kill -9 of the leader → the standby's first "
          f"iteration done: " + ", ".join(f"{t:.2f}s" for t in times)
          + f" (max {max(times):.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
