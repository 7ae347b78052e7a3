"""The real SSH path held open: memory and CPU per held session, at N real sshd nodes.

Each node is a real OpenSSH ``sshd`` on 127.0.0.1 with an ``llmgw agent serve`` behind
it (fixture hardware in turn, ``tests/support/nodes.py``), as in ``fanout.py``. A fresh
child process stands for the daemon: it opens a :class:`~llmgw.transport.pools.Pool`
over the cluster (after a pool of one node, so that imports and first-use buffers
are not counted per session), asks every node for its report (one SSH session each, the agent's
socket forwarded, a gRPC channel over it), and then holds the sessions. Printed:

* the daemon's RSS grown per held session (over the RSS before the pool existed),
  after the first round and again after ``--hold`` idle seconds;
* its CPU per session: for the first round (handshakes included), for each warm round
  (``Pool.fleet()`` over the held sessions; ``--rounds`` of them), and per idle second;
* on the nodes' side, the RSS of the sshd processes each held session keeps (the
  descendants of each node's listening sshd), per session.

Run: ``.venv/bin/python tests/bench/sessions.py --nodes 100``. Nothing is asserted;
every process started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from support import nodes  # noqa: E402

from llmgw.spec import loading  # noqa: E402
from llmgw.transport import pools  # noqa: E402

HARDWARE = ("h100-ib", "l40s-nofabric", "cpu-only")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_of(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE
    except OSError:
        return 0


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as children:
                kids = [int(k) for k in children.read().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def daemon(cluster_dir: str, rounds: int, hold: float, out: Connection) -> None:
    """The child standing for the daemon: a pool, its first round, warm rounds, a hold."""
    directory = Path(cluster_dir)
    cluster = loading.load(directory)

    async def run() -> dict[str, Any]:
        # One node first, in a pool of its own: the imports and buffers that the first
        # session of any size pays are not counted per session.
        async with pools.Pool(cluster, directory, call_timeout=120) as warmup:
            await warmup.fleet(warmup.nodes[:1])
        gc.collect()
        before = rss_of("self")
        pool = pools.Pool(cluster, directory, call_timeout=120)
        try:
            cpu, wall = cpu_seconds(), time.perf_counter()
            fleet = await pool.fleet()
            first = {"wall": time.perf_counter() - wall, "cpu": cpu_seconds() - cpu}
            failed = sorted(f"{n}: {r.error}" for n, r in fleet.nodes.items()
                            if not r.reachable)
            gc.collect()
            held = rss_of("self") - before
            walls, cpu = [], cpu_seconds()
            for _ in range(rounds):
                wall = time.perf_counter()
                await pool.fleet()
                walls.append(time.perf_counter() - wall)
            warm_cpu = (cpu_seconds() - cpu) / max(rounds, 1)
            out.send(("held", None))  # the parent reads the nodes' side now
            cpu = cpu_seconds()
            await asyncio.sleep(hold)
            idle_cpu = cpu_seconds() - cpu
            gc.collect()
            after = rss_of("self") - before
            connects = sum(pool.transport(n).connects for n in pool.nodes)
        finally:
            await pool.aclose()
        return {"first": first, "failed": failed, "held": held, "after": after,
                "warm_walls": walls, "warm_cpu": warm_cpu, "idle_cpu": idle_cpu,
                "connects": connects}

    out.send(("done", asyncio.run(run())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100, help="sshd nodes (default 100)")
    parser.add_argument("--rounds", type=int, default=5, help="warm rounds (default 5)")
    parser.add_argument("--hold", type=float, default=30.0,
                        help="seconds the sessions are held idle (default 30)")
    args = parser.parse_args()
    if args.nodes < 1 or args.rounds < 1 or args.hold < 0:
        parser.error("--nodes and --rounds must be at least 1, --hold 0 or more")
    if not shutil.which(nodes.SSHD) or not shutil.which("ssh-keygen"):
        print(f"sessions bench skipped: {nodes.SSHD} or ssh-keygen missing (make sysdeps)")
        return 0
    nodes.sweep_abandoned()
    sim = nodes.SimCluster.create()
    try:
        start = time.perf_counter()
        for index in range(args.nodes):
            sim.add_node(f"node-{index + 1:03d}", HARDWARE[index % len(HARDWARE)])
        sim.start()
        sim.pin_host_keys()
        cluster_dir = sim.write_cluster(max_parallel=min(args.nodes, 64))
        print(f"{args.nodes} sshd nodes up in {time.perf_counter() - start:.1f}s (sshd + "
              f"llmgw agent each, 127.0.0.1); {os.cpu_count()} CPUs; load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        listening = {name: node.sshd.pid for name, node in sim.nodes.items()
                     if node.sshd is not None}
        idle_sshd = sum(rss_of(p) for pid in listening.values() for p in descendants(pid))
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        child = context.Process(target=daemon, args=(str(cluster_dir), args.rounds,
                                                     args.hold, theirs))
        child.start()
        theirs.close()
        ours.recv()  # the sessions are held
        held_sshd = sum(rss_of(p) for pid in listening.values() for p in descendants(pid))
        _, result = ours.recv()
        child.join(60)
    finally:
        sim.close()
    count = args.nodes
    first, walls = result["first"], result["warm_walls"]
    print(f"first round: {first['wall']:.2f} s, CPU {first['cpu'] * 1e3 / count:.1f} ms per "
          f"session (SSH handshake, forward, channel, one report); {result['connects']} "
          f"connections for {count} nodes")
    print(f"warm rounds: median {statistics.median(walls):.3f} s, CPU "
          f"{result['warm_cpu'] * 1e3 / count:.2f} ms per session per round")
    idle = result["idle_cpu"] / max(args.hold, 1e-9) * 1e6 / count
    print(f"held idle {args.hold:g} s: CPU {idle:.1f} us/s per session")
    print(f"daemon RSS per held session: {result['held'] / count / 1024:.1f} KiB after the "
          f"first round, {result['after'] / count / 1024:.1f} KiB after the warm rounds and "
          f"the hold")
    per_node = (held_sshd - idle_sshd) / count / 2**20
    print(f"nodes' side: the sshd processes of a held session, {per_node:.1f} MiB RSS each "
          "(each node's listening sshd's descendants, summed)")
    for failure in result["failed"][:3]:
        print(f"unreachable: {failure}")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
