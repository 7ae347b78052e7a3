"""Daemon memory per node: a gRPC channel, its pushed-observation stream, its report.

A fleet simulator of ``--nodes`` agents runs in a child process
(:mod:`llmgw.onboarding.fleetsims`); for each set of channel options, a fresh
child process stands for the daemon: it opens one channel per node (the pool's
simulated transport), then each node's ``WatchUnits`` push stream, reading its
first (full) report and holding it as the pool does. The RSS grown over the RSS
before the pool existed is printed per node after each step, side by side for
each option set, in one run. The last row reaches the same nodes through the
simulator's relay (:mod:`llmgw.transport.relays`): one channel and one merged
push stream for all of them, the pool holding each node's pushed report.

Run: ``.venv/bin/python tests/bench/channels.py --nodes 500``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import shutil
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from llmgw.onboarding import fleetsims
from llmgw.spec import loading
from llmgw.transport import pools, relays, transports

DEFAULT = transports.CHANNEL_OPTIONS
LEAN = (*DEFAULT,
        ("grpc.enable_retries", 0),  # no per-call retry buffer
        ("grpc.http2.bdp_probe", 0),  # no window growth: reports are small
        ("grpc.experimental.tcp_read_chunk_size", 4096),
        ("grpc.experimental.tcp_min_read_chunk_size", 1024),
        ("grpc.experimental.tcp_max_read_chunk_size", 16384),
        ("grpc.http2.write_buffer_size", 4096))
OPTIONS: dict[str, tuple[tuple[str, Any], ...]] = {"as shipped": DEFAULT, "lean": LEAN,
                                                   "through a relay": DEFAULT}
RELAYED = "through a relay"


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fleet(root: str, nodes: int, control: Connection) -> None:
    async def run() -> None:
        sim = fleetsims.SimulatedFleet(Path(root), nodes, relay=True)
        await sim.start()
        sim.write_cluster(fleetsims.models(1))
        control.send("up")
        await asyncio.get_running_loop().run_in_executor(None, control.recv)
        await sim.aclose()

    asyncio.run(run())


def daemon(root: str, name: str, out: Connection) -> None:
    transports.CHANNEL_OPTIONS = OPTIONS[name]  # read by each channel the pool opens

    async def run() -> dict[str, float]:
        directory = Path(root) / "cluster"
        cluster = loading.load(directory)
        gc.collect()
        before = rss_bytes()
        if name == RELAYED:
            return await relayed(cluster, directory, before)
        pool = pools.Pool(cluster, directory, simulated=Path(root) / "sockets")
        nodes = sorted(cluster.nodes)
        clients = [await pool.client(n) for n in nodes]
        await asyncio.gather(*(pool.report(n) for n in nodes))  # connected; reports dropped
        gc.collect()
        channel = rss_bytes() - before
        streams = [c.observe(pools.declared_for(cluster, n)) for c, n in
                   zip(clients, nodes, strict=True)]
        reports = [(await anext(s)).report for s in streams]
        gc.collect()
        streamed = rss_bytes() - before
        del reports
        gc.collect()
        without = rss_bytes() - before
        for stream in streams:
            await stream.aclose()
        await pool.aclose()
        count = len(nodes)
        return {"channel + one call": channel / count, "+ stream and report": streamed / count,
                "report dropped": without / count}

    out.send(asyncio.run(run()))


async def relayed(cluster: Any, directory: Path, before: int) -> dict[str, float]:
    sockets = directory.parent / "sockets"
    pool = pools.Pool(cluster, directory, simulated=sockets, push=True,
                      relays=relays.advertised(sockets))
    nodes = sorted(cluster.nodes)
    await asyncio.gather(*(pool.report(n) for n in nodes))  # through the relay; dropped
    gc.collect()
    channel = rss_bytes() - before
    pool.push(lambda node, why: None)
    while len(pool.streaming) < len(nodes):
        await asyncio.sleep(0.05)
    gc.collect()
    streamed = rss_bytes() - before
    await pool.aclose()  # the views go with the streams
    gc.collect()
    without = rss_bytes() - before
    count = len(nodes)
    return {"channel + one call": channel / count, "+ stream and report": streamed / count,
            "report dropped": without / count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmgw-ch-", dir="/tmp"))
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    sim = context.Process(target=fleet, args=(str(root), args.nodes, theirs))
    sim.start()
    try:
        ours.recv()
        rows = {}
        for name in OPTIONS:
            mine, child_end = context.Pipe()
            child = context.Process(target=daemon, args=(str(root), name, child_end))
            child.start()
            rows[name] = mine.recv()
            child.join(60)
        steps = list(next(iter(rows.values())))
        print(f"{args.nodes} simulated nodes; RSS grown per node (KiB), one process per row")
        print("| channel options | " + " | ".join(steps) + " |")
        print("|---|" + "---:|" * len(steps))
        for name, row in rows.items():
            print(f"| {name} | " + " | ".join(f"{row[s] / 1024:.1f}" for s in steps) + " |")
    finally:
        ours.send("stop")
        sim.join(60)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
