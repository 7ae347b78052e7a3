"""``llmgw node add`` from nothing to the first report: one bare node, then N at once.

Bare simulated nodes (a real sshd each on 127.0.0.1, no agent, no llmgw):
``llmgw node add`` pins the key, runs preflight, ships the wheels over SFTP,
installs them into a venv per node, starts the agent (supervise backend) and
waits for its first report. Rows: one node alone, then ``--parallel`` nodes
added at once (one ``node add`` process each, as a script would), with the
time to the first report per node and the wall time of the whole batch,
side by side in one run. The wheels are built before timing starts (the
cache every run after the first uses). Printed, never asserted.

    .venv/bin/python tests/bench/onboard.py [--parallel 10]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from support import nodes  # noqa: E402

from llmgw.onboarding import enrolments  # noqa: E402

WHEELS = ROOT / ".cache" / "wheels"
REPORT = re.compile(r"first report after (\d+\.\d+)s")


def site(directory: Path, sim: nodes.SimCluster) -> Path:
    subprocess.run([sys.executable, "-m", "llmgw", "init", "site", "--no-mirror", "--no-node",
                    "--no-model"], cwd=directory, check=True, capture_output=True)
    cluster = directory / "site" / "cluster"
    text = (cluster / "cluster.yaml").read_text().replace("user: llmgw ", "user: root  ")
    commented = "    # identity_file: ~/.ssh/id_ed25519   # default: your SSH agent's keys\n"
    text = text.replace(commented, f"    identity_file: {sim.client_key}\n")
    (cluster / "cluster.yaml").write_text(text)
    return cluster


def add(cluster: Path, node: nodes.SimNode) -> tuple[float, str, int]:
    """Seconds from starting ``llmgw node add`` to its exit after the first report."""
    begun = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "node", "add", f"root@127.0.0.1:{node.port}",
         "--name", node.name, "--prefix", str(node.root / "opt"), "--wheels", str(WHEELS),
         "--fingerprint", node.host_fingerprint(), "--cluster", str(cluster)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
    return time.monotonic() - begun, done.stdout + done.stderr, done.returncode


def batch(count: int) -> tuple[float, list[float], list[float]]:
    """Wall time of adding ``count`` bare nodes at once; per node: add → report, agent → report."""
    sim = nodes.SimCluster.create()
    try:
        for index in range(count):
            sim.add_node(f"bare-{index + 1:02d}")
        sim.start(agents=False)
        with tempfile.TemporaryDirectory() as scratch:
            cluster = site(Path(scratch), sim)
            begun = time.monotonic()
            with ThreadPoolExecutor(count) as pool:
                runs = list(pool.map(lambda node: add(cluster, node), sim.nodes.values()))
            wall = time.monotonic() - begun
        failed = [output for _, output, code in runs if code != 0]
        if failed:
            raise SystemExit(f"node add failed:\n{failed[0]}")
        firsts = []
        for _, output, _ in runs:
            match = REPORT.search(output)
            assert match, output
            firsts.append(float(match.group(1)))
        return wall, [seconds for seconds, _, _ in runs], firsts
    finally:
        sim.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", type=int, default=10)
    args = parser.parse_args()
    enrolments.build_wheels(WHEELS)  # outside the timings
    rows = [("1 node", *batch(1)), (f"{args.parallel} nodes at once", *batch(args.parallel))]
    print(f"{'run':<20}{'wall (s)':>10}{'node add → report (s)':>24}{'agent → report (s)':>20}")
    for name, wall, totals, firsts in rows:
        print(f"{name:<20}{wall:>10.1f}{statistics.median(totals):>18.1f} med"
              f"{max(totals):>6.1f}{statistics.median(firsts):>20.1f}")
    one_wall, many_wall = rows[0][1], rows[1][1]
    print(f"\n{args.parallel} nodes took {many_wall / one_wall:.1f}× the wall time of one "
          f"({many_wall / args.parallel:.1f}s per node).")


if __name__ == "__main__":
    main()
