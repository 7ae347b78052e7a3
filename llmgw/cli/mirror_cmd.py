"""``llmgw mirror serve|pull|add``: a hub-compatible endpoint for sites without a route out.

The mirror directory has the layout of a node's weights directory: hub
repos under ``DIR/hub`` in the hub cache layout. So ``pull`` is the very
fetch a node runs (resumable, verified), ``serve`` answers the subset of the
hub API that ``huggingface_hub`` uses, and a node's own weights directory can
be served as a mirror as it is. Nodes use it when the cluster sets
``cluster.weights.endpoint``.

``serve`` runs on the router's connections (:mod:`llmgw.router.connections`):
headers within ``--header-timeout``, at most ``--max-connections`` open, no
access log and no client bytes in any log line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

from llmgw.cli.errors import UserError
from llmgw.hub import caches, fetches, mirrors
from llmgw.router import connections
from llmgw.spec import sources

TOKEN_ENV = "LLMGW_MIRROR_TOKEN"
HEADER_TIMEOUT = 15.0  # the router's default (router.apps.Settings)
MAX_CONNECTIONS = 4096


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mirror", help="serve or fill a hub-compatible mirror for air-gapped sites",
        description="A directory of hub repos (DIR/hub, the hub cache layout) served over "
        "the hub's HTTP API, so nodes fetch from it with `cluster.weights.endpoint`.",
    )
    commands = parser.add_subparsers(dest="mirror_command", metavar="COMMAND", required=True)
    serve = commands.add_parser("serve", help="serve DIR as a hub endpoint")
    serve.add_argument("dir", type=Path, metavar="DIR")
    serve.add_argument("--listen", default="127.0.0.1:8090", metavar="HOST:PORT",
                       help="where to listen (default 127.0.0.1:8090; port 0: any free "
                       "port, printed at start)")
    serve.add_argument("--token-file", type=Path, metavar="FILE",
                       help="require `Authorization: Bearer <the file's token>` on every "
                       f"request (else the token in ${TOKEN_ENV}, if set)")
    serve.add_argument("--max-rate", type=float, default=0.0, metavar="BYTES_PER_S",
                       help="bound each response's bytes per second (default: unbounded)")
    serve.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT,
                       metavar="SECONDS", help="close a connection whose request line and "
                       f"headers are not in within this (default {HEADER_TIMEOUT:g})")
    serve.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                       help="answer 503 to connections past N open (default "
                       f"{MAX_CONNECTIONS}, and below the open-files limit)")
    serve.set_defaults(handler=run_serve)
    pull = commands.add_parser("pull", help="fetch a repo into DIR from an upstream hub")
    pull.add_argument("source", metavar="REPO",
                      help="org/name[@revision][:files], as a model's source")
    pull.add_argument("--dir", type=Path, required=True, metavar="DIR")
    pull.add_argument("--from", dest="upstream", metavar="URL",
                      help="the hub to pull from (default: HF_ENDPOINT, else the public hub)")
    pull.add_argument("--token-file", type=Path, metavar="FILE",
                      help="a file holding a token for gated repos")
    pull.set_defaults(handler=run_pull)
    add = commands.add_parser("add", help="put local files into DIR as a repo")
    add.add_argument("dir", type=Path, metavar="DIR")
    add.add_argument("repo", metavar="ORG/NAME")
    add.add_argument("files", nargs="+", type=Path, metavar="FILE")
    add.add_argument("--revision", default="main")
    add.set_defaults(handler=run_add)


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UserError(f"--listen expects HOST:PORT; got {text!r}")
    return host.strip("[]"), int(port)


def _token(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if not token:  # an empty file must not leave a mirror meant to be gated open
        raise UserError(f"{path} is empty: it should hold the token clients send")
    return token


def _serve_token(path: Path | None) -> str:
    """The token ``serve`` requires: the file's, else ``$LLMGW_MIRROR_TOKEN``, else none."""
    if path is not None:
        return _token(path)
    return os.environ.get(TOKEN_ENV, "").strip()


async def start(application: web.Application, host: str, port: int, *,
                header_timeout: float = HEADER_TIMEOUT,
                max_connections: int = MAX_CONNECTIONS) -> web.AppRunner:
    """Serve the mirror's ``application`` on the router's bounded connections."""
    if header_timeout <= 0 or max_connections < 1:
        raise UserError("--header-timeout must be above 0 and --max-connections at least 1")
    limit = connections.connection_limit(max_connections,
                                         connections.raise_open_files_limit())
    runner = connections.runner(application, header_timeout=header_timeout,
                                max_connections=limit, service=connections.MIRROR)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return runner


async def _serve(args: argparse.Namespace, root: Path, host: str, port: int) -> None:
    application = mirrors.app(root, token=_serve_token(args.token_file),
                              max_rate=args.max_rate)
    runner = await start(application, host, port, header_timeout=args.header_timeout,
                         max_connections=args.max_connections)
    try:
        repos = list(caches.repos(root))
        bound = runner.addresses[0][1] if runner.addresses else port
        gated = " (token required)" if application[mirrors.TOKEN] else ""
        print(f"llmgw mirror serving {len(repos)} repo{'s' if len(repos) != 1 else ''} from "
              f"{args.dir} on http://{host}:{bound}{gated}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def run_serve(args: argparse.Namespace) -> int:
    root = args.dir / "hub"
    if not root.is_dir():
        raise UserError(f"{args.dir} has no hub/ directory: fill it with `llmgw mirror pull` "
                        "or `llmgw mirror add`")
    host, port = _host_port(args.listen)
    asyncio.run(_serve(args, root, host, port))
    return 0


def run_pull(args: argparse.Namespace) -> int:
    try:
        source = sources.parse(args.source)
    except sources.SourceError as exc:
        raise UserError(str(exc)) from None
    if source.kind != "hub":
        raise UserError(f"{args.source!r} is not a hub repo (org/name[@revision][:files])")
    progress = fetches.Progress("weights", source.text)
    done = asyncio.run(_pull(source, args, progress))
    print(f"{source.text}: {done.size_bytes} bytes at commit {done.commit} in {args.dir}")
    return 0


async def _pull(source: sources.Source, args: argparse.Namespace,
                progress: fetches.Progress) -> fetches.Fetched:
    task = asyncio.create_task(asyncio.to_thread(
        fetches.fetch, source, args.dir, endpoint=args.upstream,
        token=_token(args.token_file) or None, progress=progress,
    ))
    while not task.done():
        await asyncio.wait([task], timeout=2.0)
        if progress.bytes_total:
            rate = f" at {progress.rate_bps / 1e6:.1f} MB/s" if progress.rate_bps else ""
            print(f"  {progress.bytes_done / 1e6:.1f} of {progress.bytes_total / 1e6:.1f} MB"
                  f"{rate}", file=sys.stderr, flush=True)
    try:
        return task.result()
    except fetches.FetchError as exc:
        raise UserError(str(exc)) from None


def run_add(args: argparse.Namespace) -> int:
    try:
        source = sources.parse(args.repo)
    except sources.SourceError as exc:
        raise UserError(str(exc)) from None
    if source.kind != "hub" or source.patterns or "@" in args.repo:
        raise UserError(f"{args.repo!r}: expected org/name (the revision is --revision)")
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        raise UserError(f"not a file: {', '.join(missing)}")
    started = time.monotonic()
    commit = caches.add(args.dir / "hub", args.repo, {f.name: f for f in args.files},
                        revision=args.revision)
    print(f"{args.repo}@{args.revision} is commit {commit} in {args.dir} "
          f"({len(args.files)} file{'s' if len(args.files) != 1 else ''}, "
          f"{time.monotonic() - started:.1f}s)")
    return 0
