"""The same burst with autoscaling off and on, side by side, on real llama-servers.

Each row is one ``llmgw serve`` on ``make run``'s local cluster (the supervise backend,
the real ``llama-server`` with Gemma 3 270M, two slots of one thread per replica, the
router capping each replica at two requests: ``tests/support/scaledclusters.py``). The
official ``openai`` client sends the same load to both (``tests/support/bursts.py``): a
trickle of ``--trickle`` streams/s, a burst of ``--concurrency`` streams kept open at once
for ``--burst`` seconds, the trickle again for ``--tail`` seconds.

* **off**: ``scaling: {min: 1, max: 1}`` — one replica throughout;
* **on**: ``scaling: {min: 1, max: 2, target: {waiting_per_replica: 2}}`` with the windows
  and cooldown of the e2e test (2 s up, 5 s down, 5 s cooldown).

Columns: time to first token of the burst's requests (p50, p95), requests served in the
burst and in the whole run (an answer whose stream finished), failed requests, and
replica-seconds over the whole run (``run``: from the first request to the last answer):
each replica from its first report to its last, loading included; with autoscaling, when
the second replica was placed and when one was left again. On GPUs that figure,
times the GPUs per replica, is the GPU-seconds used; here the replicas run on the CPU.
Printed, never asserted.

    .venv/bin/python tests/bench/elastic.py [--concurrency 8] [--burst 30] [--tail 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from support import bursts, scaledclusters  # noqa: E402

SLOTS = 2
WINDOWS = {"up_window": "2s", "down_window": "5s", "cooldown": "5s"}
MODES = {
    "off": {"min": 1, "max": 1},
    "on": {"min": 1, "max": 2, "target": {"waiting_per_replica": 2}, **WINDOWS},
}


@dataclass(frozen=True)
class Row:
    mode: str
    p50: float
    p95: float
    burst_served: int
    served: int
    failed: int
    replica_seconds: float
    seconds: float
    most: int
    scaled_up_after: float | None  # seconds into the burst when a second replica was placed
    one_again_after: float | None  # seconds after the burst's last request: one replica left


async def measure(mode: str, args: argparse.Namespace, tmp: Path) -> Row:
    daemon = scaledclusters.start(tmp, scaling=MODES[mode], routing={"max_in_flight": SLOTS},
                                  args={**scaledclusters.ARGS, "parallel": SLOTS})
    try:
        with scaledclusters.Replicas(daemon) as replicas:
            await asyncio.to_thread(replicas.wait, lambda s: s.ready() == 1 == len(s.states),
                                    "the first replica", 180)
            load = bursts.Load(f"{daemon.router}/v1", scaledclusters.NAME,
                               max_tokens=args.max_tokens)
            begun = time.monotonic()
            outcomes = await load.run([
                bursts.Steady(rate=args.trickle, seconds=args.lead),
                bursts.Burst(concurrency=args.concurrency, seconds=args.burst),
                bursts.Steady(rate=args.trickle, seconds=args.tail, name="tail"),
            ])
            ended = time.monotonic()
            burst = [o for o in outcomes if o.phase == "burst"]
            firsts = bursts.first_tokens(burst)
            start = load.spans["burst"][0]
            placed = replicas.first(lambda s: len(s.states) >= 2, since=start)
            stopped = max(o.started for o in burst)  # the burst's last request
            one = None if placed is None else replicas.first(
                lambda s: len(s.states) == 1, since=placed.at)
            return Row(mode, bursts.percentile(firsts, 0.5), bursts.percentile(firsts, 0.95),
                       sum(o.ok for o in burst), sum(o.ok for o in outcomes),
                       len(bursts.failures(outcomes)), replicas.replica_seconds(begun, ended),
                       ended - begun, replicas.most(begun, ended),
                       None if placed is None else placed.at - start,
                       None if one is None else one.at - stopped)
    finally:
        daemon.stop(signal.SIGINT)


def table(rows: list[Row], args: argparse.Namespace, load: float) -> str:
    lines = [
        f"burst: {args.concurrency} streams open at once for {args.burst:g} s, between "
        f"{args.lead:g} s and {args.tail:g} s of {args.trickle:g} stream/s; "
        f"max_tokens {args.max_tokens}; {SLOTS} slots per replica; CPUs: {os.cpu_count()}; "
        f"load average at start: {load:.1f}",
        "",
        "| autoscaling | TTFT p50 | TTFT p95 | served (burst) | served (run) | failed | "
        "replica-seconds | run | most replicas | second replica placed | one again |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        placed = ("—" if row.scaled_up_after is None
                  else f"{row.scaled_up_after:.1f} s into the burst")
        again = ("—" if row.one_again_after is None
                 else f"{row.one_again_after:.1f} s after the burst's last request")
        lines.append(f"| {row.mode} | {row.p50:.2f} s | {row.p95:.2f} s | {row.burst_served} "
                     f"| {row.served} | {row.failed} | {row.replica_seconds:.0f} | "
                     f"{row.seconds:.0f} s | {row.most} | {placed} | {again} |")
    off, on = rows
    lines += ["", f"on / off: TTFT p50 {on.p50 / off.p50:.2f}x, p95 {on.p95 / off.p95:.2f}x, "
              f"burst requests served {on.burst_served / max(off.burst_served, 1):.2f}x, "
              f"replica-seconds {on.replica_seconds / off.replica_seconds:.2f}x"]
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--burst", type=float, default=30.0, help="seconds")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds of trickle before")
    parser.add_argument("--tail", type=float, default=20.0, help="seconds of trickle after")
    parser.add_argument("--trickle", type=float, default=1.0, help="streams/s")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    if not scaledclusters.built():
        print("skipped: the real engine and model are not built (`make engine model`)")
        return 0
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-elastic-") as tmp:
        for mode in MODES:
            (Path(tmp) / mode).mkdir()
            rows.append(await measure(mode, args, Path(tmp) / mode))
    print(table(rows, args, load))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
