"""``llmgw engine install|list``: engine versions on the nodes.

``install ENGINE==VERSION [NODE…]`` installs one version on the named nodes
(default: every node) through their agents, each into its own directory
(:mod:`llmgw.onboarding.engineinstalls`). llama.cpp ships a ``llama-server``
from this machine (``--binary``, default: the one on PATH); vLLM and SGLang
install ``--requirements FILE`` (every line pinned by ``--hash``) from the
agent's index or ``--index-url``. Exits 1 when any node failed.

``list`` shows, per node, where engines go, which versions are installed,
and installs under way or failed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
from pathlib import Path

from llmgw.agent import installs
from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.inventory_cmd import add_timeout_flag, collect
from llmgw.fleet.types import Fleet
from llmgw.onboarding import engineinstalls
from llmgw.onboarding.engineinstalls import Wanted
from llmgw.transport import pools

WANTED = re.compile(r"^(?P<engine>[a-z.]+)==(?P<version>\S+)$")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "engine", help="install engine versions on nodes; list what they have",
        description="Engine versions installed by llmgw, one directory each on the node "
        "(docs/engines.md, \"Engine versions\").",
    )
    commands = parser.add_subparsers(dest="engine_command", metavar="COMMAND", required=True)
    install = commands.add_parser(
        "install", help="install ENGINE==VERSION on nodes (default: every node)")
    install.add_argument("wanted", metavar="ENGINE==VERSION",
                         help="llama.cpp==11434.0.0, vllm==0.11.0, sglang==0.5.23")
    install.add_argument("node", nargs="*", help="nodes (default: every node)")
    install.add_argument("--binary", type=Path,
                         help="llama.cpp: the llama-server to ship (default: the one on PATH)")
    install.add_argument("--requirements", type=Path, metavar="FILE",
                         help="vLLM, SGLang: requirements pinned with --hash "
                         "(pip-compile --generate-hashes)")
    install.add_argument("--index-url", default="", metavar="URL",
                         help="vLLM, SGLang: the index to install from (default: the agent's "
                         "engines.index_url)")
    install.add_argument("--extra-index-url", action="append", default=[], metavar="URL",
                         help="vLLM, SGLang: another index to search (repeatable); the hashes "
                         "decide what is accepted")
    clusters.add_cluster_flag(install)
    add_timeout_flag(install)
    install.set_defaults(handler=run_install)
    listing = commands.add_parser("list", help="per node: installed versions, installs under way")
    clusters.add_cluster_flag(listing)
    add_timeout_flag(listing)
    listing.set_defaults(handler=run_list)


def wanted_from(args: argparse.Namespace) -> Wanted:
    match = WANTED.match(args.wanted)
    if match is None:
        raise UserError(f"{args.wanted!r}: write ENGINE==VERSION, e.g. llama.cpp==11434.0.0")
    engine, version = match["engine"], match["version"]
    if engine == "llama.cpp":
        binary = args.binary or (Path(found) if (found := shutil.which("llama-server")) else None)
        if binary is None or not binary.is_file():
            raise UserError(f"no llama-server to ship: {binary or 'none on PATH'}; "
                            "give --binary (`make engine` builds one)")
        placeholder = "<shipped>"
        try:
            installs.request(engine, version, binary=placeholder)
        except installs.InstallError as exc:
            raise UserError(str(exc)) from None
        return Wanted(engine, version, binary=binary.resolve())
    if args.requirements is None:
        raise UserError(f"{engine} needs --requirements FILE: every package pinned with "
                        "--hash (docs/engines.md)")
    try:
        text = args.requirements.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{args.requirements}: cannot read: {exc}") from None
    try:
        installs.request(engine, version, requirements=text, index_url=args.index_url,
                         extra_index_urls=args.extra_index_url)
    except installs.RequirementsError as exc:
        raise UserError(f"{args.requirements}:{exc.line}:1: {exc.detail}") from None
    except installs.InstallError as exc:
        raise UserError(f"{args.requirements}: {exc}") from None
    return Wanted(engine, version, requirements=text, index_url=args.index_url,
                  extra_index_urls=tuple(args.extra_index_url))


def run_install(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    wanted = wanted_from(args)
    nodes = args.node or sorted(cluster.nodes)
    unknown = [n for n in nodes if n not in cluster.nodes]
    if unknown:
        raise UserError(f"no node {', '.join(unknown)} in the cluster")

    def say(line: str) -> None:
        print(line, flush=True)

    async def run() -> dict[str, engineinstalls.Outcome]:
        async with pools.Pool(cluster, args.cluster, call_timeout=args.timeout) as pool:
            return await engineinstalls.install(pool, nodes, wanted, say)

    outcomes = asyncio.run(run())
    counts = {state: sum(1 for o in outcomes.values() if o.state == state)
              for state in ("done", "already", "skipped", "failed")}
    print(f"{wanted.target}: {counts['done']} installed, {counts['already']} already there, "
          f"{counts['skipped']} skipped, {counts['failed']} failed.")
    return 1 if counts["failed"] else 0


def render_list(fleet: Fleet) -> str:
    lines = []
    for name, report in sorted(fleet.nodes.items()):
        if report.error:
            lines.append(f"{name}  unreachable: {report.error}")
            continue
        facts = report.host
        if facts is None or facts.engines_dir is None:
            lines.append(f"{name}  its agent installs no engines")
            continue
        lines.append(f"{name}  engines in {facts.engines_dir}")
        for found in facts.installed_engines:
            lines.append(f"  {found.engine} {found.version}  {found.path}")
        if not facts.installed_engines:
            lines.append("  (none installed)")
        for fetch in report.fetches:
            if fetch.kind == "engine" and fetch.state != "done":
                detail = f": {fetch.error}" if fetch.error else ""
                lines.append(f"  {fetch.target}  {fetch.state}{detail}")
    return "\n".join(lines) + "\n"


def run_list(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    sys.stdout.write(render_list(collect(cluster, args.cluster, args.timeout)))
    return 0
