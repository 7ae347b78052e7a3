"""Router overhead, measured in one run against one fast mock upstream.

Rows: the upstream directly; through llmgw's router; through a bare aiohttp
proxy that only forwards (the floor any aiohttp-based router stands on; it
buffers streams, so its stream row is a bound, not a peer); through nginx (Debian's,
a temporary config on loopback, keep-alive to the upstream, buffering off);
through LiteLLM's proxy when it is installed (it is not a dependency);
through vllm-router and sglang-router, the Rust load balancers on PyPI, when the
bench's peer venv has them (``make bench-peers``: a separate venv, PEERS_VENV or
``$LLMGW_BENCH_PEERS``, so they are peers to measure, never llmgw dependencies;
rows skipped when absent; neither checks keys or writes usage).
Columns, for a non-streaming and a streaming chat completion: requests/s
with ``--connections`` concurrent keep-alive clients, and latency at one
client at a time — p50 and p99, and what each adds over the direct path.
Runs are interleaved across the rows and each figure is the best of
``--rounds``, so a burst of other load on the machine skews no single row.

The load generator is ``wrk`` (Debian package; ``make sysdeps``). Every
process listens on 127.0.0.1 only and the run is bounded by ``--duration``.
llmgw runs as it does in production: keys checked against SQLite, usage
rows written, metrics recorded. Numbers are printed, never asserted.

A second table, streaming at the router's limit: a second upstream answers
every request with a chat-completions stream of STREAM_CHUNKS chunks, each
written on its own (tests/support/upstream.py, ``--stream-chunks``); wrk
counts the SSE chunks of whole answers with a Lua script (CHUNKS_LUA).
Rows: direct, llmgw (and llmgw+uvloop), nginx; columns: chunks/s, ratios,
and CPU µs per chunk of each path's process and of the upstream, from /proc.
``--profile FILE`` then samples llmgw with py-spy under the same load
(with ``--only requests``: under the plain requests/s load).

    .venv/bin/python tests/bench/router.py [--duration 2] [--rounds 3] [--connections 32]
        [--only requests|streaming] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from support.streamloads import (  # noqa: E402
    Load,
    Streamed,
    measure_streams,
    profile_summary,
    wrk_chunks,
)

BODY = '{"model":"bench","messages":[{"role":"user","content":"Say hello to the benchmark."}]}'
STREAM_BODY = BODY[:-1] + ',"stream":true}'
STREAM_CHUNKS = 200  # content chunks per answer in the streaming rows
# The peers' own venv (`make bench-peers`); they bring their own aiohttp, fastapi, ...
PEERS_VENV = Path(os.environ.get("LLMGW_BENCH_PEERS", ROOT / ".cache" / "bench-peers"))
PEERS = {  # row -> the command that runs it in front of one upstream
    "vllm-router": ["vllm-router", "--worker-urls", "{upstream}", "--log-level", "warning",
                    "--prometheus-port", "{metrics}", "--policy", "round_robin"],
    "sglang-router": ["sglang-router", "launch", "--worker-urls", "{upstream}",
                      "--log-level", "warn", "--prometheus-port", "{metrics}",
                      "--policy", "round_robin"],
}

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""

LITELLM_CONF = """\
model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: http://127.0.0.1:{upstream}/v1
      api_key: none
"""


@dataclass
class Measure:
    rps: float
    p50_us: float
    p99_us: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@contextlib.contextmanager
def process(argv: list[str], port: int, **kwargs: object) -> Iterator[subprocess.Popen[bytes]]:
    # stderr goes to a file, not a pipe: a server that logs more than a pipe holds (64 KiB)
    # while nobody reads it would block mid-run and stall its row.
    errors = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors,
                            start_new_session=True, **kwargs)  # type: ignore[call-overload]
    try:
        try:
            wait_port(port)
        except RuntimeError:
            proc.kill()
            proc.wait()
            errors.seek(0)
            why = errors.read().decode(errors="replace")
            raise RuntimeError(f"{argv[0]} did not start: {why}") from None
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        errors.close()


_UNITS = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}
WRK_PREFIX: list[str] = []  # e.g. ["taskset", "-c", "1"]: the load generator pinned apart


def wrk(url: str, body: str, key: str, connections: int, duration: float, tmp: Path) -> Measure:
    script = tmp / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = '{body}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    out = subprocess.run(
        [*WRK_PREFIX, "wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency", "-s",
         str(script),
         url + "/v1/chat/completions"],
        capture_output=True, text=True, timeout=duration + 30, check=True,
    ).stdout
    if "Non-2xx" in out or "Socket errors" in out or re.search(r"^\s*0 requests", out, re.M):
        raise RuntimeError(f"errors while measuring {url}:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    percentiles = {
        int(p): float(v) * _UNITS[u]
        for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    }
    return Measure(rps, percentiles[50], percentiles[99])


def measure_once(target: Target, mode: str, args: argparse.Namespace, tmp: Path) -> Measure:
    body = BODY if mode == "plain" else STREAM_BODY
    try:
        load = wrk(target.url, body, target.key, args.connections, args.duration, tmp)
        latency = wrk(target.url, body, target.key, 1, args.duration, tmp)
    except RuntimeError as exc:
        raise RuntimeError(f"{target.name}, {mode}: {exc}") from None
    return Measure(load.rps, latency.p50_us, latency.p99_us)


@dataclass
class Target:
    name: str
    url: str
    key: str = "none"
    pid: int = 0  # the process serving it, when the bench started it (to profile)


NOTES: list[str] = []  # printed after the tables: rows skipped and why


def serve_router(port: int, upstream: int, db: str, key_file: str, loop: str) -> None:
    """The llmgw row's server: the Router as `llmgw serve` builds it."""
    from prometheus_client import CollectorRegistry

    from llmgw.router import Endpoint, Router, catalogs
    from llmgw.spec.models import Cluster, StoreSettings
    from llmgw.store import keys, stores

    cluster = Cluster.model_validate({
        "cluster": {"name": "bench", "auth": "keys"},
        "models": {"bench": {"profiles": [{"engine": "llama.cpp", "cpu": True}],
                             "pricing": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}},
        "projects": {"bench": {"budget_usd": None}},
    })
    async def main() -> None:
        store = await stores.open_store(StoreSettings(path=db))
        Path(key_file).write_text((await keys.create(store, "bench")).secret)
        router = Router(catalogs.from_cluster(cluster), store=store, registry=CollectorRegistry())
        router.update_routes({"bench": [Endpoint(f"http://127.0.0.1:{upstream}", "local", 0)]})
        await router.start("127.0.0.1", port)
        # As `llmgw serve` should: what exists after start-up lives as long as the process,
        # so keep it out of the collector's full passes (multi-ms pauses in p99 otherwise).
        gc.freeze()
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        if loop == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())


def serve_bare(port: int, upstream: int, relay: bool) -> None:
    """The floor: an aiohttp proxy doing nothing but forward (no keys, usage, metrics).

    ``relay``: pass a body on as its reads arrive (the streaming table's floor) instead
    of reading it whole first.
    """
    import aiohttp
    from aiohttp import web

    async def main() -> None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            async with session.post(f"http://127.0.0.1:{upstream}{request.path}", data=body,
                                    headers={"Content-Type": "application/json"}) as reply:
                if relay:
                    response = web.StreamResponse(
                        status=reply.status,
                        headers={"Content-Type": reply.headers["Content-Type"]})
                    try:
                        await response.prepare(request)
                        async for data in reply.content.iter_any():
                            await response.write(data)
                        await response.write_eof()
                    except ConnectionResetError:
                        pass  # wrk stopped mid-stream; a traceback would fill the stderr pipe
                    return response
                data = await reply.read()
                return web.Response(status=reply.status, body=data,
                                    headers={"Content-Type": reply.headers["Content-Type"]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per figure (best)")
    parser.add_argument("--connections", type=int, default=32, help="concurrent clients")
    parser.add_argument("--only", choices=("requests", "streaming"),
                        help="run one table: requests/s and latency, or streaming chunks/s")
    parser.add_argument("--profile", metavar="FILE",
                        help="after the streaming rounds, sample llmgw with py-spy under the "
                             "same load; write the collapsed stacks to FILE, print the top")
    parser.add_argument("--baseline", metavar="DIR",
                        help="add rows for the llmgw package in DIR (another version, e.g. "
                             "`git archive` of a commit), for before/after")
    parser.add_argument("--profile-load", choices=("plain", "stream"), default="plain",
                        help="with --only requests: profile under plain or streamed requests")
    parser.add_argument("--profile-top", type=int, default=15, metavar="N",
                        help="functions listed by --profile (default 15)")
    parser.add_argument("--serve-router", nargs=5,
                        metavar=("PORT", "UPSTREAM", "DB", "KEYFILE", "LOOP"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", nargs=3, metavar=("PORT", "UPSTREAM", "MODE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        port, upstream, mode = args.serve_bare
        serve_bare(int(port), int(upstream), relay=mode == "relay")
        return 0
    if args.serve_router:
        port, upstream, db, key_file, loop = args.serve_router
        serve_router(int(port), int(upstream), db, key_file, loop)
        return 0
    missing = [tool for tool in ("wrk", "nginx") if not (shutil.which(tool) or
               Path(f"/usr/sbin/{tool}").exists())]
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (`make sysdeps`)")
        return 0
    args.load_before = os.getloadavg()[0]
    if importlib.util.find_spec("uvloop") is None:
        NOTES.append("llmgw+uvloop: uvloop not installed, row skipped")
    if args.only != "streaming":
        requests_rows(args)
    if args.only != "requests":
        streaming_rows(args)
    for note in NOTES:
        print(f"note: {note}")
    return 0


def requests_rows(args: argparse.Namespace) -> None:
    """Requests/s and latency of plain and (short) streaming answers, every path."""
    python = sys.executable
    notes = NOTES
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmpdir, \
            contextlib.ExitStack() as running:
        tmp = Path(tmpdir)
        up = free_port()
        running.enter_context(
            process([python, str(ROOT / "tests/support/upstream.py"), "--port", str(up)], up))
        targets = [Target("direct", f"http://127.0.0.1:{up}")]

        targets += start_routers(tmp / "requests", up, running)
        if args.baseline:
            targets += start_routers(tmp / "baseline", up, running, baseline=args.baseline)

        port = free_port()
        running.enter_context(process([python, __file__, "--serve-bare", str(port), str(up),
                                       "buffer"],
                                      port, cwd=ROOT))
        targets.append(Target("bare aiohttp", f"http://127.0.0.1:{port}"))

        targets.append(start_nginx(tmp / "nginx", up, running))

        if importlib.util.find_spec("litellm") is None:
            notes.append("litellm: not installed, row skipped (it is not an llmgw "
                         "dependency; `pip install 'litellm[proxy]'` to include it)")
        else:
            port = free_port()
            conf = tmp / "litellm.yaml"
            conf.write_text(LITELLM_CONF.format(upstream=up))
            running.enter_context(process([python, "-m", "litellm", "--config", str(conf),
                                           "--host", "127.0.0.1", "--port", str(port)], port))
            targets.append(Target("litellm", f"http://127.0.0.1:{port}"))

        targets += start_peers(up, running)

        # Rounds interleave the targets, and each figure is the best of its rounds: load
        # from other processes on the machine only ever slows a run down, so the best run
        # is the closest to what each path costs, and all rows are treated alike.
        results: dict[str, dict[str, Measure]] = {t.name: {} for t in targets}
        for target in targets:
            for mode in ("plain", "stream"):
                wrk(target.url, BODY if mode == "plain" else STREAM_BODY, target.key,
                    args.connections, 1, tmp)  # warm: pools, caches
        for _ in range(args.rounds):
            for target in targets:
                for mode in ("plain", "stream"):
                    m = measure_once(target, mode, args, tmp)
                    best = results[target.name].get(mode)
                    results[target.name][mode] = m if best is None else Measure(
                        max(best.rps, m.rps), min(best.p50_us, m.p50_us),
                        min(best.p99_us, m.p99_us))
        if args.profile and args.only == "requests":
            llmgw_target = next(t for t in targets if t.name == "llmgw")
            profile(llmgw_target, args, tmp,
                    lambda seconds: wrk(llmgw_target.url,
                                        STREAM_BODY if args.profile_load == "stream" else BODY,
                                        llmgw_target.key,
                                        args.connections, seconds, tmp))
    print(table(results, args))
    llmgw, nginx_row = results["llmgw"], results["nginx"]
    for mode in ("plain", "stream"):
        added = llmgw[mode].p50_us - results["direct"][mode].p50_us
        added99 = llmgw[mode].p99_us - results["direct"][mode].p99_us
        ratio = llmgw[mode].rps / nginx_row[mode].rps
        floor = llmgw[mode].rps / results["bare aiohttp"][mode].rps
        print(f"{mode}: llmgw adds {added / 1000:.3f} ms at p50 (target < 1 ms), "
              f"{added99 / 1000:.3f} ms at p99 (target < 1.5 ms); "
              f"{ratio:.2f}× nginx's requests/s (target ≥ 0.5×); "
              f"{floor:.2f}× the bare aiohttp proxy's (target ≥ 0.9×)")


def start_peers(upstream: int, running: contextlib.ExitStack) -> list[Target]:
    """vllm-router and sglang-router in front of ``upstream``, from PEERS_VENV; a row
    whose executable is not there is skipped with a note."""
    targets = []
    for name, template in PEERS.items():
        executable = PEERS_VENV / "bin" / template[0]
        if not executable.exists():
            NOTES.append(f"{name}: not in {PEERS_VENV.name}/, row skipped (a peer, not a "
                         "dependency; `make bench-peers` installs it)")
            continue
        port = free_port()
        argv = [str(executable), *(arg.format(upstream=f"http://127.0.0.1:{upstream}",
                                              metrics=free_port()) for arg in template[1:]),
                "--host", "127.0.0.1", "--port", str(port)]
        running.enter_context(process(argv, port))
        targets.append(Target(name, f"http://127.0.0.1:{port}"))
    return targets


def streaming_rows(args: argparse.Namespace) -> None:
    """SSE chunks/s of long streams (STREAM_CHUNKS chunks, each sent on its own)."""
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmpdir, \
            contextlib.ExitStack() as running:
        tmp = Path(tmpdir)
        up = free_port()
        upstream = running.enter_context(process(
            [python, str(ROOT / "tests/support/upstream.py"), "--port", str(up),
             "--stream-chunks", str(STREAM_CHUNKS)], up))
        targets = [Target("direct", f"http://127.0.0.1:{up}")]
        routers = start_routers(tmp / "streaming", up, running)
        targets += routers
        if args.baseline:
            targets += start_routers(tmp / "baseline", up, running, baseline=args.baseline)
        port = free_port()
        bare = running.enter_context(process(
            [python, __file__, "--serve-bare", str(port), str(up), "relay"], port, cwd=ROOT))
        targets.append(Target("bare aiohttp relay", f"http://127.0.0.1:{port}", pid=bare.pid))
        targets.append(start_nginx(tmp / "nginx", up, running))
        load = Load(STREAM_BODY, STREAM_CHUNKS, args.connections)
        runs: dict[str, list[Streamed]] = {target.name: [] for target in targets}
        for target in targets:
            wrk_chunks(target.url, target.key, load, 1, tmp)  # warm
        for _ in range(args.rounds):
            for target in targets:
                try:
                    runs[target.name].append(measure_streams(
                        target.url, target.key, target.pid, upstream.pid, load,
                        args.duration, tmp))
                except RuntimeError as exc:
                    raise RuntimeError(f"{target.name}, streaming: {exc}") from None
        if args.profile:
            profile(routers[0], args, tmp,
                    lambda seconds: wrk_chunks(routers[0].url, routers[0].key, load, seconds,
                                               tmp))
    best = {name: max(run.rate for run in row) for name, row in runs.items()}
    print()
    print(f"streaming: {STREAM_CHUNKS} chat-completion chunks per answer, each written on "
          f"its own by the upstream; wrk, 1 thread, {args.connections} connections; "
          f"SSE chunks/s in whole answers, best of {args.rounds} interleaved "
          f"{args.duration:g} s runs (CPU per chunk: median); CPUs: {os.cpu_count()}; "
          f"load average at start: {args.load_before:.1f}")
    print()
    print("| path | chunks/s | × direct | × nginx | path CPU µs/chunk (user + sys) | "
          "upstream CPU µs/chunk |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in runs.items():
        rate = best[name]
        user = statistics.median(run.user_us for run in row)
        system = statistics.median(run.system_us for run in row)
        cpu = "—" if name == "direct" else f"{user + system:.1f} ({user:.1f} + {system:.1f})"
        print(f"| {name} | {rate:,.0f} | {rate / best['direct']:.2f} | "
              f"{rate / best['nginx']:.2f} | {cpu} | "
              f"{statistics.median(run.upstream_us for run in row):.1f} |")
    print(f"streaming: llmgw relays {best['llmgw'] / best['nginx']:.2f}× nginx's chunks/s "
          "(target ≥ 0.9×)")


def start_routers(tmp: Path, upstream: int, running: contextlib.ExitStack,
                  baseline: str | None = None) -> list[Target]:
    """llmgw in front of ``upstream``: on asyncio's loop, and on uvloop's when installed.

    ``baseline``: a directory with another version's ``llmgw`` package (``git archive``
    of a commit), run instead of this one's, for a before/after in one run.
    """
    tmp.mkdir(exist_ok=True)
    loops = ["asyncio"]
    if importlib.util.find_spec("uvloop") is not None:
        loops.append("uvloop")  # the same router on uvloop's event loop, for comparison
    env = None
    if baseline is not None:
        if not (Path(baseline) / "llmgw" / "router").is_dir():
            raise SystemExit(f"--baseline {baseline}: no llmgw/router package there")
        env = {**os.environ, "PYTHONPATH": str(Path(baseline).resolve())}
    targets = []
    for loop in loops:
        port = free_port()
        key_file = tmp / f"key-{loop}"
        argv = [sys.executable, __file__, "--serve-router", str(port), str(upstream),
                str(tmp / f"llmgw-{loop}.db"), str(key_file), loop]
        proc = running.enter_context(process(argv, port, cwd=ROOT, env=env))
        name = "llmgw" if loop == "asyncio" else f"llmgw+{loop}"
        if baseline is not None:
            name += " (baseline)"
        targets.append(Target(name, f"http://127.0.0.1:{port}", key_file.read_text(),
                              pid=proc.pid))
    return targets


def start_nginx(tmp: Path, upstream: int, running: contextlib.ExitStack) -> Target:
    """Debian's nginx, one worker, in front of ``upstream`` (config: NGINX_CONF)."""
    tmp.mkdir(exist_ok=True)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, upstream=upstream, port=port))
    proc = running.enter_context(process(
        [nginx, "-p", str(tmp), "-e", str(tmp / "nginx-error.log"), "-c", str(conf)], port))
    return Target("nginx", f"http://127.0.0.1:{port}", pid=proc.pid)


def profile(target: Target, args: argparse.Namespace, tmp: Path,
            run_load: Callable[[float], object]) -> None:
    """py-spy samples ``target``'s process under ``run_load(seconds)``, after the measured
    rounds (sampling costs CPU); writes the collapsed stacks and prints the top functions."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        NOTES.append("profile: py-spy not installed (`pip install -e '.[bench]'`), skipped")
        return
    seconds = max(int(args.duration * 2), 2)
    spy = subprocess.Popen([py_spy, "record", "--pid", str(target.pid), "--format", "raw",
                            "--rate", "250", "--duration", str(seconds), "--nonblocking",
                            "--output", str(args.profile)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # attached before the load starts
    run_load(seconds)
    if spy.wait(seconds + 30) != 0:
        NOTES.append(f"profile: py-spy failed: {spy.communicate()[1].decode()[-500:]}")
        return
    print()
    print(profile_summary(Path(args.profile).read_text(), args.profile_top))


def table(results: dict[str, dict[str, Measure]], args: argparse.Namespace) -> str:
    lines = [
        f"wrk, 1 thread; req/s at {args.connections} connections; latency at 1 connection; "
        f"best of {args.rounds} interleaved {args.duration:g} s runs; CPUs: {os.cpu_count()}; "
        f"load average at start: {args.load_before:.1f}",
        "",
        "| path | mode | req/s | p50 | p99 | added p50 | added p99 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    direct = results["direct"]
    for name, row in results.items():
        for mode in ("plain", "stream"):
            m, d = row[mode], direct[mode]
            added = "—" if name == "direct" else f"{(m.p50_us - d.p50_us) / 1000:+.3f} ms"
            added99 = "—" if name == "direct" else f"{(m.p99_us - d.p99_us) / 1000:+.3f} ms"
            lines.append(f"| {name} | {mode} | {m.rps:,.0f} | {m.p50_us / 1000:.3f} ms | "
                         f"{m.p99_us / 1000:.3f} ms | {added} | {added99} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
