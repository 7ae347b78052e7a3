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
from collections.abc import Callable, Mapping
from pathlib import Path

from llmgw.agent import installs
from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.inventory_cmd import add_timeout_flag, collect
from llmgw.fleet.types import Fleet
from llmgw.onboarding import engineinstalls
from llmgw.onboarding.engineinstalls import Wanted
from llmgw.spec.models import Cluster
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
    return wanted_for(match["engine"], match["version"], binary=args.binary,
                      requirements=args.requirements, index_url=args.index_url,
                      extra_index_urls=tuple(args.extra_index_url))


def wanted_for(engine: str, version: str, *, binary: Path | None = None,
               requirements: Path | None = None, index_url: str = "",
               extra_index_urls: tuple[str, ...] = ()) -> Wanted:
    """What installs ``engine version``, checked; :class:`UserError` says what is wrong.

    llama.cpp: ``binary``, default the ``llama-server`` on PATH. vLLM, SGLang:
    the ``requirements`` file, every line ``name==version --hash=sha256:…``.
    """
    if engine == "llama.cpp":
        binary = binary or (Path(found) if (found := shutil.which("llama-server")) else None)
        if binary is None or not binary.is_file():
            raise UserError(f"no llama-server to ship: {binary or 'none on PATH'}; "
                            "give --binary (`make engine` builds one)")
        placeholder = "<shipped>"
        try:
            installs.request(engine, version, binary=placeholder)
        except installs.InstallError as exc:
            raise UserError(str(exc)) from None
        return Wanted(engine, version, binary=binary.resolve())
    if requirements is None:
        raise UserError(f"{engine} needs --requirements FILE: every package pinned with "
                        "--hash (docs/engines.md)")
    try:
        return engineinstalls.from_requirements(engine, version, requirements,
                                                index_url=index_url,
                                                extra_index_urls=extra_index_urls)
    except engineinstalls.WantedError as exc:
        raise UserError(str(exc)) from None


requirements_path = engineinstalls.requirements_path


REQUIREMENTS_NAME = re.compile(r"^(?P<engine>vllm|sglang)-(?P<version>[^/]+)\.txt$")


def requirement_file_errors(directory: Path) -> list[str]:
    """``file:line:col: message`` for each bad requirements file under ``engines/`` of a
    cluster directory (what ``llmgw validate`` prints): a name that is not
    ``vllm-VERSION.txt`` or ``sglang-VERSION.txt``, a line not pinned by hash."""
    folder = directory / "engines"
    if not folder.is_dir():
        return []
    errors: list[str] = []
    for path in sorted(folder.iterdir()):
        where = f"engines/{path.name}"
        match = REQUIREMENTS_NAME.match(path.name)
        if match is None or not path.is_file():
            errors.append(f"{where}:1:1: not a requirements file llmgw installs: name it "
                          "vllm-VERSION.txt or sglang-VERSION.txt (llama.cpp is shipped, "
                          "not installed from requirements)")
            continue
        try:
            text = path.read_text()
            installs.request(match["engine"], match["version"], requirements=text)
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{where}:1:1: cannot read: {exc}")
        except installs.RequirementsError as exc:
            errors.append(f"{where}:{exc.line}:1: {exc.detail}")
        except installs.InstallError as exc:
            errors.append(f"{where}:1:1: {exc}")
    return errors


def declared_requirement_errors(directory: Path, cluster: Cluster) -> list[str]:
    """``file:line:col: message`` for each engine of ``engines:`` that llmgw installs
    (``install: auto`` or ``profiles``) whose requirements file is not there."""
    errors = []
    for engine, declared in cluster.engines.declared():
        path = requirements_path(directory, engine, declared.version)
        if declared.install != "never" and not path.is_file():
            errors.append(f"engines/{path.name}:1:1: missing: engines.{engine} (version "
                          f"{declared.version}, install: {declared.install}) installs from it; "
                          "write it with `pip-compile --generate-hashes` (docs/engines.md)")
    return errors


async def install_missing(pool: pools.Pool, directory: Path,
                          needs: Mapping[tuple[str, str], set[str]],
                          say: Callable[[str], None], *,
                          never: frozenset[str] = frozenset()) -> list[str]:
    """Install each needed (engine, version) on the nodes that lack it, as ``llmgw apply``
    does before it changes anything; the failures, one line each (none: all there).

    llama.cpp ships the ``llama-server`` on PATH; vLLM and SGLang install the
    cluster directory's ``engines/<engine>-<version>.txt`` (:func:`requirements_path`).
    An engine in ``never`` (``engines.<engine>.install: never``) is not installed: each
    such need is a failure saying so.
    """
    failures: list[str] = []
    for (engine, version), nodes in needs.items():
        if engine in never:
            failures.append(f"{engine} {version} on {', '.join(sorted(nodes))}: not installed "
                            f"by llmgw (engines.{engine}.install is never): install it there "
                            "yourself, or set install: profiles")
            continue
        try:
            wanted = wanted_for(engine, version, requirements=None if engine == "llama.cpp"
                                else requirements_path(directory, engine, version))
        except UserError as exc:
            failures.append(f"{engine} {version} on {', '.join(sorted(nodes))}: {exc}")
            continue
        outcomes = await engineinstalls.install(pool, sorted(nodes), wanted, say)
        failures += [f"{node}: installing {wanted.target} failed: {outcome.detail}"
                     for node, outcome in sorted(outcomes.items()) if outcome.state == "failed"]
    return failures


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
