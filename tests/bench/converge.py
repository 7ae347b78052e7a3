"""Bounded convergence: the real daemon loop against a simulated fleet of N nodes.

The fleet simulator (:mod:`llmgw.onboarding.fleetsims`: N real agents, fixture
hardware, each on its own gRPC socket, stand-in engines ready ``--load-delay``
after they start) runs in a child process; the daemon's loop
(:class:`llmgw.daemon.reconcilers.Daemon`, a pool over the simulated transport
with pushed observations) runs in another, so that process's memory and CPU are
the daemon's (a fresh process for each size and path). Phases, in order:

1. first convergence: every replica placed and ready (not a goal: a fresh fleet);
2. steady state, ``--steady`` seconds: rounds per minute, each round's time, the
   daemon's CPU per node and its RSS per node (over the RSS before the pool and
   loop existed);
3. an edit touching 1 % of the models (a flag changed: each replica replaced):
   from the file written to every replica of theirs ready with its new digest;
4. ``--lose`` nodes lost at once (their servers stop, their sockets go), half of
   them hosting replicas: until the daemon sees every one unreachable; then back:
   until every one is reachable again and every replica ready.

Each size runs twice by default (``--paths``): *direct*, the daemon holding a channel
and a push stream per node, and *relayed*, each simulator process also serving a relay
(:mod:`llmgw.transport.relays`) so the daemon holds one channel and one merged stream
per process; the relays' own memory is the simulator's, not counted here.

Run: ``.venv/bin/python tests/bench/converge.py --nodes 1000`` (``--nodes 1000 10000``
for both). Nothing is asserted: it prints what it measured and the goals beside.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import logging
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from llmgw.daemon.reconcilers import Daemon
from llmgw.onboarding import fleetsims
from llmgw.spec import loading
from llmgw.transport import pools, relays

GOALS = "goals: steady-state round < 1 s; edit converged < 10 s + load time; < 50 KB/node"
BOUND = 1800.0  # a bound on every wait, not a measurement


PER_PROCESS = 4000  # simulated nodes per child: each holds two descriptors per node


def simulator(root: str, nodes: int, models: int, replicas: int, load_delay: float,
              drift: str, part: tuple[int, int], relay: bool, control: Connection) -> None:
    """A child: its part of the fleet simulator, driven by messages on ``control``."""

    async def run() -> None:
        sim = fleetsims.SimulatedFleet(Path(root), nodes, load_delay=load_delay, part=part,
                                       relay=relay)
        started = time.monotonic()
        await sim.start()
        if part[0] == 0:
            sim.write_cluster(fleetsims.models(models, replicas), drift_interval=drift)
        control.send(("up", time.monotonic() - started))
        loop = asyncio.get_running_loop()
        while True:
            command, names = await loop.run_in_executor(None, control.recv)
            if command == "lose":
                await sim.lose(names)
            elif command == "restore":
                await sim.restore(names)
            else:
                break
            control.send(("done", None))
        await sim.aclose()
        control.send(("stopped", None))

    logging.basicConfig(level=logging.ERROR)
    asyncio.run(run())


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Bench:
    def __init__(self, daemon: Daemon, pool: pools.Pool) -> None:
        self.daemon, self.pool = daemon, pool
        self.rounds: list[float] = []  # seconds each reconcile took, in order
        reconcile = daemon.reconcile

        async def timed(reasons: set[str] | None = None) -> Any:
            started = time.perf_counter()
            try:
                return await reconcile(reasons)
            finally:
                self.rounds.append(time.perf_counter() - started)

        daemon.reconcile = timed  # type: ignore[method-assign]

    def units(self) -> list[tuple[str, Any]]:
        fleet = self.daemon.state.fleet
        return [] if fleet is None else [(n, u) for n, r in fleet.nodes.items() for u in r.units]

    def ready(self) -> dict[tuple[str, int], str]:
        return {(u.model, u.replica): u.digest for _, u in self.units() if u.state == "ready"}

    def unreachable(self) -> set[str]:
        fleet = self.daemon.state.fleet
        return set() if fleet is None else {n for n, r in fleet.nodes.items() if not r.reachable}

    async def until(self, check: Callable[[], Any], what: str) -> float:
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > BOUND:
                raise SystemExit(f"gave up waiting for {what} after {BOUND:.0f}s")
            await asyncio.sleep(0.05)
        return time.monotonic() - started


class Pauses:
    """The cyclic collector's passes while installed: (generation, seconds) each, so a
    long round can be told apart from a long full collection."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.passes.append((info["generation"], time.perf_counter() - self._began))

    def __enter__(self) -> Pauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> str:
        full = [s for g, s in self.passes if g == 2]
        return (f"collector: {len(self.passes)} passes, longest "
                f"{max((s for _, s in self.passes), default=0.0):.3f} s; "
                f"{len(full)} full, longest {max(full, default=0.0):.3f} s")


def median_max(values: list[float]) -> str:
    if not values:
        return "no rounds"
    return f"median {statistics.median(values):.3f} s, max {max(values):.3f} s " \
           f"({len(values)} rounds)"


async def measure(nodes: int, path: str, args: argparse.Namespace) -> dict[str, Any]:
    models = args.models or max(100, nodes // 10)
    root = Path(tempfile.mkdtemp(prefix="llmgw-cb-", dir="/tmp"))
    context = multiprocessing.get_context("spawn")
    parts = -(-nodes // PER_PROCESS)
    pipes, children = [], []
    for index in range(parts):
        ours, theirs = context.Pipe()
        child = context.Process(target=simulator, args=(
            str(root), nodes, models, args.replicas, args.load_delay, args.drift,
            (index, parts), path == "relayed", theirs))
        child.start()
        pipes.append(ours)
        children.append(child)
    loop = asyncio.get_running_loop()

    async def each(message: tuple[str, list[str]] | None) -> list[Any]:
        def one(pipe: Connection) -> Any:
            if message is not None:
                pipe.send(message)
            return pipe.recv()[1]
        return await asyncio.gather(*(loop.run_in_executor(None, one, p) for p in pipes))

    up = max(await each(None))
    tag = f"{nodes} {path}"
    print(f"[{tag}] simulator up in {up:.1f}s ({parts} processes; {models} models x "
          f"{args.replicas})", flush=True)
    out: dict[str, Any] = {"nodes": nodes, "path": path, "models": models, "sim_up": up}

    async def tell(command: str, names: list[str]) -> None:
        await each((command, names))

    try:
        directory = root / "cluster"
        baseline = rss_bytes()
        loaded = time.monotonic()
        reader = loading.Reader()  # as `llmgw serve` loads: the daemon reloads through it
        cluster = reader.load(directory)
        out["load"] = time.monotonic() - loaded
        print(f"[{tag}] cluster directory loaded in {out['load']:.1f}s", flush=True)
        advertised = relays.advertised(root / "sockets") if path == "relayed" else {}
        pool = pools.Pool(cluster, directory, simulated=root / "sockets", push=True,
                          relays=advertised)
        daemon = Daemon(directory, cluster, agents=pool, ready_timeout=BOUND, reader=reader)
        bench = Bench(daemon, pool)
        stop = asyncio.Event()
        task = asyncio.create_task(daemon.run(stop))
        wanted = models * args.replicas
        out["first"] = await bench.until(lambda: len(bench.ready()) == wanted, "first ready")
        print(f"[{tag}] first convergence: {wanted} replicas ready in {out['first']:.1f}s "
              f"({len(bench.rounds)} rounds)", flush=True)
        await bench.until(lambda: len(pool.streaming) == nodes, "every node streaming")

        # Steady state.
        await asyncio.sleep(2)
        if args.freeze:
            gc.freeze()  # a trial, in the bench only: the daemon itself does not
        first_round, polled, pushed = len(bench.rounds), pool.polled, pool.pushed
        profiler = cProfile.Profile() if args.profile else None
        cpu, wall = cpu_seconds(), time.monotonic()
        if profiler is not None:
            profiler.enable()
        with Pauses() as pauses:
            await asyncio.sleep(args.steady)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{args.profile}.{nodes}.{path}")
        cpu, wall = cpu_seconds() - cpu, time.monotonic() - wall
        steady = bench.rounds[first_round:]
        out.update(steady_rounds=steady, steady_wall=wall, steady_cpu=cpu,
                   rss=rss_bytes() - baseline, rss_total=rss_bytes(),
                   steady_polled=pool.polled - polled, steady_pushed=pool.pushed - pushed)
        print(f"[{tag}] steady state {wall:.0f}s: rounds {median_max(steady)}; "
              f"{len(steady) * 60 / wall:.1f} rounds/min; CPU {cpu / wall * 100:.1f}% of a "
              f"core ({cpu / wall / nodes * 1e6:.1f} us/s per node); RSS +{out['rss'] / 2**20:.0f}"
              f" MiB ({out['rss'] / nodes / 1024:.1f} KiB/node); reports asked "
              f"{out['steady_polled']}, pushes {out['steady_pushed']}; {pauses.summary()}",
              flush=True)

        # An edit touching 1 % of the models.
        before = bench.ready()
        edited = sorted(cluster.models)[:max(1, models // 100)]
        old = {before[(m, r)] for m in edited for r in range(args.replicas)
               if (m, r) in before}
        first_round = len(bench.rounds)
        written = time.monotonic()
        fleetsims.write_models(directory, fleetsims.models(models, args.replicas,
                                                           edited=edited))

        def edit_done() -> bool:
            now = bench.ready()
            mine = [d for (m, _), d in now.items() if m in edited]
            return len(now) == wanted and len(mine) == len(edited) * args.replicas \
                and not set(mine) & old

        await bench.until(edit_done, "the edit converged")
        out["edit"] = time.monotonic() - written
        out["edit_rounds"] = bench.rounds[first_round:]
        out["edited"] = len(edited)
        print(f"[{tag}] edit of {len(edited)} models ({len(edited) * args.replicas} "
              f"replicas): converged in {out['edit']:.2f}s (load time {args.load_delay:g}s; "
              f"rounds {median_max(out['edit_rounds'])})", flush=True)

        # Nodes lost at once, then back.
        hosting = sorted({n for n, u in bench.units()})
        others = sorted(set(cluster.nodes) - set(hosting))
        lost = hosting[:args.lose // 2]
        lost += others[:args.lose - len(lost)]
        first_round = len(bench.rounds)
        await tell("lose", lost)
        out["lose_seen"] = await bench.until(lambda: bench.unreachable() >= set(lost),
                                             "the lost nodes unreachable")
        await asyncio.sleep(3)
        out["lost_rounds"] = bench.rounds[first_round:]
        gone = time.monotonic()
        first_round = len(bench.rounds)
        await tell("restore", lost)
        out["back_seen"] = await bench.until(
            lambda: not bench.unreachable() and len(bench.ready()) == wanted,
            "the lost nodes back")
        out["back_streaming"] = await bench.until(lambda: len(pool.streaming) == nodes,
                                                  "every node streaming again")
        out["back_rounds"] = bench.rounds[first_round:]
        del gone
        print(f"[{tag}] {len(lost)} nodes lost ({len(hosting[:args.lose // 2])} hosting "
              f"replicas): all unreachable after {out['lose_seen']:.2f}s (rounds while lost "
              f"{median_max(out['lost_rounds'])}); back: reachable, every replica ready after "
              f"{out['back_seen']:.2f}s, every stream reopened "
              f"{out['back_streaming']:.1f}s later", flush=True)
        stop.set()
        await asyncio.wait_for(task, 120)
    finally:
        await each(("stop", []))
        for child in children:
            child.join(60)
        shutil.rmtree(root, ignore_errors=True)
    return out


def daemon(nodes: int, path: str, args: argparse.Namespace, out: Connection) -> None:
    """A child standing for the daemon: one per measurement, so that what one run freed
    but the allocator kept is not in the next one's RSS."""
    logging.basicConfig(level=logging.ERROR)
    out.send(asyncio.run(measure(nodes, path, args)))


def apart(nodes: int, path: str, args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=daemon, args=(nodes, path, args, theirs))
    child.start()
    theirs.close()  # so that a child that dies ends the wait below
    try:
        result: dict[str, Any] = ours.recv()
    except EOFError:
        raise SystemExit(f"the {path} run at {nodes} nodes failed (its output is above)"
                         ) from None
    child.join(60)
    return result


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    rows = [
        "| nodes | path | models | steady round (median / max) | rounds/min | daemon CPU per node "
        "| daemon RSS per node | edit of 1 % converged | 100 lost: all seen | back: all ready |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        steady = r["steady_rounds"]
        rows.append(
            f"| {r['nodes']:,} | {r['path']} | {r['models']} | {statistics.median(steady):.3f} s / "
            f"{max(steady):.3f} s | {len(steady) * 60 / r['steady_wall']:.1f} | "
            f"{r['steady_cpu'] / r['steady_wall'] / r['nodes'] * 1e6:.1f} us/s | "
            f"{r['rss'] / r['nodes'] / 1024:.1f} KiB | {r['edit']:.2f} s "
            f"({r['edit'] - args.load_delay:.2f} s + {args.load_delay:g} s load) | "
            f"{r['lose_seen']:.2f} s | {r['back_seen']:.2f} s |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--models", type=int, default=None,
                        help="models (default: nodes/10, at least 100)")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--load-delay", type=float, default=2.0)
    parser.add_argument("--steady", type=float, default=60.0)
    parser.add_argument("--lose", type=int, default=100)
    parser.add_argument("--drift", default="10s", help="cluster.drift_interval")
    parser.add_argument("--paths", nargs="+", choices=("direct", "relayed"),
                        default=["direct", "relayed"],
                        help="how the daemon reaches the agents (default: both, in turn)")
    parser.add_argument("--freeze", action="store_true",
                        help="gc.freeze() the daemon's heap after the first convergence (a trial "
                        "of keeping it out of the collector's full passes; the daemon does not)")
    parser.add_argument("--profile", metavar="PATH", help="cProfile the steady state into "
                        "PATH.<nodes>.<path> (the CPU and round times then include the profiler's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; drift_interval "
          f"{args.drift}; stand-in load time {args.load_delay:g}s", flush=True)
    results = [apart(n, path, args) for n in args.nodes for path in args.paths]
    print()
    print(table(results, args))
    print(GOALS)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
