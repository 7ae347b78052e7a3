"""Fetching weights: llmgw's fetch beside curl, a resume, and apply → Ready with and without.

All from one local hub-compatible server (`llmgw mirror serve`'s aiohttp
application, in this process, which counts the body bytes it sends), over
the gemma GGUF (253 MB), in one run:

* throughput — the agent's fetch (``llmgw.hub.fetches.fetch``: the real
  huggingface_hub client for metadata, streaming with sha256 verification,
  into the hub cache layout) in a fresh process, versus ``curl -o`` of the
  same URL, interleaved, ``--repeat`` times each; the median of each;
* resume — a fetch killed with SIGKILL half way (the server bounded to
  ``--resume-rate`` so the kill lands mid-file), then run again: the bytes
  the server sent in the rerun beyond what was missing (target < 1 % of the
  file);
* apply → Ready — ``llmgw serve`` on ``make run``'s cluster with the model's
  source a repo on the mirror: time until the replica is ready with the
  weights directory empty, then again with the weights present (skipped
  without the engine: ``make engine``).

Times are printed, never asserted. Loopback only; every process started is
stopped.

    .venv/bin/python tests/bench/fetch.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests" / "hub"))
sys.path.insert(0, str(ROOT / "tests"))

from mirror_support import GEMMA, GEMMA_REPO, gemma_repo, serving  # noqa: E402
from support import nodes  # noqa: E402

from llmgw.hub import caches  # noqa: E402

ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
SOURCE = f"{GEMMA_REPO}:Q4_K_M"
# huggingface_hub is imported before the clock starts: the agent is a long-lived
# process that has it loaded already.
FETCH = ("import sys, time\nfrom huggingface_hub import HfApi, get_session, hf_hub_url\n"
         "from llmgw.hub import fetches\nfrom llmgw.spec import sources\n"
         "started = time.perf_counter()\n"
         "progress = fetches.Progress('weights', sys.argv[1])\n"
         "fetches.fetch(sources.parse(sys.argv[1]), sys.argv[2], endpoint=sys.argv[3],"
         " progress=progress)\n"
         "print(time.perf_counter() - started, progress.rate_bps)\n")


def fetch_once(url: str, target: Path) -> tuple[float, float]:
    """(seconds for the whole fetch, its transfer rate once the metadata was read)."""
    shutil.rmtree(target, ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", FETCH, SOURCE, str(target), url],
                         capture_output=True, text=True, check=True, timeout=600)
    seconds, rate = out.stdout.split()[-2:]
    return float(seconds), float(rate)


def curl_once(url: str, target: Path) -> float:
    target.unlink(missing_ok=True)
    started = time.perf_counter()
    subprocess.run(["curl", "-sSf", "-o", str(target), url], check=True, timeout=600)
    return time.perf_counter() - started


def throughput(work: Path, repeat: int) -> tuple[float, float, float]:
    root = work / "mirror" / "hub"
    commit = gemma_repo(root)
    size = GEMMA.stat().st_size
    with serving(root) as mirror:
        url = f"{mirror.url}/{GEMMA_REPO}/resolve/{commit}/gemma-3-270m-it-Q4_K_M.gguf"
        ours, streams, theirs = [], [], []
        for _ in range(repeat):
            seconds, rate = fetch_once(mirror.url, work / "node")
            ours.append(size / seconds)
            streams.append(rate)
            theirs.append(size / curl_once(url, work / "curl.gguf"))
    return statistics.median(ours), statistics.median(streams), statistics.median(theirs)


def resume(work: Path, rate: float) -> tuple[int, int, int]:
    """(file size, bytes on disk at the kill, bytes sent in the rerun)."""
    root = work / "mirror" / "hub"
    size = GEMMA.stat().st_size
    node = work / "resume-node"
    shutil.rmtree(node, ignore_errors=True)
    with serving(root, max_rate=rate) as mirror:
        child = subprocess.Popen([sys.executable, "-c", FETCH, SOURCE, str(node), mirror.url],
                                 stdout=subprocess.DEVNULL)
        blobs = node / "hub" / caches.repo_dir(Path(), GEMMA_REPO).name / "blobs"
        partial = None
        while child.poll() is None:
            partial = next(iter(blobs.glob("*.incomplete")), None) if blobs.exists() else None
            if partial is not None and partial.stat().st_size > size // 2:
                break
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert partial is not None, "the fetch ended before it could be killed"
        kept = partial.stat().st_size
    with serving(root) as mirror:
        fetch_once_keep(mirror.url, node)
        return size, kept, mirror.sent


def fetch_once_keep(url: str, target: Path) -> None:
    subprocess.run([sys.executable, "-c", FETCH, SOURCE, str(target), url],
                   capture_output=True, check=True, timeout=600)


def apply_to_ready(work: Path) -> tuple[float, float] | str:
    if not ENGINE.exists() or shutil.which("curl") is None:
        return "skipped: the engine is not built (make engine)"
    root = work / "mirror" / "hub"
    with serving(root) as mirror:
        weights = work / "apply-weights"
        shutil.rmtree(weights, ignore_errors=True)
        return serve_until_ready(work, mirror.url, weights), serve_until_ready(
            work, mirror.url, weights)


def serve_until_ready(work: Path, endpoint: str, weights: Path) -> float:
    directory = work / "cluster"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    text = (ROOT / "cluster.example" / "local" / "cluster.yaml").read_text()
    ports = {name: nodes.free_port() for name in ("router", "admin", "metrics")}
    for name, default in (("router", 8000), ("admin", 8001), ("metrics", 9400)):
        text = text.replace(f"{name}: 127.0.0.1:{default}", f"{name}: 127.0.0.1:{ports[name]}")
    text = text.replace("../../.cache/models/gemma3-270m-q4_k_m.gguf", SOURCE)
    text = text.replace("../../.cache/models", str(weights))
    # A fresh state directory each run: only the weights directory is shared.
    state = Path(tempfile.mkdtemp(prefix="state-", dir=work))
    text = text.replace("../../.cache/local/", f"{state}/")
    text = text.replace("  auth: none", f"  auth: none\n  weights: {{endpoint: {endpoint}}}")
    (directory / "cluster.yaml").write_text(text)
    env = {**os.environ, "PATH": f"{ENGINE.parent}{os.pathsep}{os.environ['PATH']}"}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "llmgw", "serve", "--cluster",
                                str(directory)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=env)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError("llmgw serve exited")
            try:
                status = httpx.get(f"http://127.0.0.1:{ports['admin']}/api/v1/status",
                                   timeout=5).json()
                if any(r["state"] == "ready" for r in status["replicas"]):
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--resume-rate", type=float, default=60e6,
                        help="bytes/s the server sends during the killed fetch")
    args = parser.parse_args()
    if not GEMMA.exists():
        print("skipped: the model is not assembled (make model)")
        return 0
    if shutil.which("curl") is None:
        print("skipped: curl is not installed")
        return 0
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-fetch-") as scratch:
        work = Path(scratch)
        ours, stream, theirs = throughput(work, args.repeat)
        size, kept, sent = resume(work, args.resume_rate)
        ready = apply_to_ready(work)
    extra = sent - (size - kept)
    print(f"gemma GGUF, {size / 1e6:.0f} MB, one local server, median of {args.repeat}")
    print(f"{'':38}{'value':>14}")
    print(f"{'curl -o':38}{theirs / 1e6:>10.0f} MB/s")
    print(f"{'llmgw fetch, end to end':38}{ours / 1e6:>10.0f} MB/s")
    print(f"{'  ratio llmgw / curl (target >= 0.9)':38}{ours / theirs:>14.2f}")
    print(f"{'llmgw fetch, bytes once metadata read':38}{stream / 1e6:>10.0f} MB/s")
    print(f"{'  ratio llmgw / curl':38}{stream / theirs:>14.2f}")
    print(f"{'resume: on disk at SIGKILL':38}{kept / 1e6:>11.1f} MB")
    print(f"{'resume: sent in the rerun':38}{sent / 1e6:>11.1f} MB")
    print(f"{'  re-transferred (target < 1 %)':38}{extra:>8d} B ({100 * extra / size:.2f} %)")
    if isinstance(ready, str):
        print(f"{'apply -> Ready':38}  {ready}")
    else:
        print(f"{'apply -> Ready, weights absent':38}{ready[0]:>12.1f} s")
        print(f"{'apply -> Ready, weights present':38}{ready[1]:>12.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
