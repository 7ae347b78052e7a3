"""``llmgw node add [USER@]HOST[:PORT]``: pin, check, install, start, report, write nodes.yaml.

The steps are :mod:`llmgw.onboarding.enrolments`'; each prints one line as it
finishes. At a terminal the host key fingerprint is confirmed interactively
and each group of RDMA adapters is assigned to a declared fabric by asking;
otherwise ``--fingerprint`` and ``--fabric`` give the answers. The node's
entry is written into ``cluster/nodes.yaml`` (comments and order kept) and
the diff printed, to commit.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

from llmgw.cli import clusters, removals
from llmgw.cli.errors import UserError
from llmgw.fleet.types import NodeReport
from llmgw.onboarding import enrolments, yamledits
from llmgw.spec.models import NAME_PATTERN

DEFAULT_PREFIX = "/opt/llmgw"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("node", help="add a machine to the cluster, or remove one")
    commands = parser.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    add = commands.add_parser(
        "add", help="pin its host key, install and start the agent, add it to nodes.yaml",
        description="Take a machine you can SSH to into the cluster. Stops before changing "
        "anything when the node lacks root/sudo, Python 3.11+ or disk.")
    add.add_argument("target", metavar="[USER@]HOST[:PORT]")
    add.add_argument("--name", help="the node's name (default: the host's first label)")
    add.add_argument("--fingerprint", metavar="SHA256:…",
                     help="the host key fingerprint to accept (checked on the node's console)")
    add.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help="a label for node_selector (repeatable)")
    add.add_argument("--fabric", action="append", default=[], metavar="NAME=ADAPTER,…",
                     help="the node's adapters on a declared fabric (repeatable)")
    add.add_argument("--prefix", default=DEFAULT_PREFIX,
                     help=f"where llmgw lives on the node (default {DEFAULT_PREFIX})")
    add.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "llmgw" / "wheels",
                     help="local cache of the wheels shipped to nodes")
    clusters.add_cluster_flag(add)
    add.set_defaults(handler=run_add)
    removals.register(commands)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise UserError(f"--{what} {value!r}: expected KEY=VALUE")
        pairs[key] = rest
    return pairs


def run_add(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    try:
        target = enrolments.parse_target(args.target, cluster.cluster.ssh.user,
                                         cluster.cluster.ssh.port)
    except enrolments.EnrolError as exc:
        raise UserError(str(exc)) from None
    if args.name is None and (":" in target.host or target.host.replace(".", "").isdigit()):
        raise UserError(f"{target.host} is an address: name the node with --name")
    name = args.name or target.host.split(".")[0].lower()
    if not re.match(NAME_PATTERN, name):
        raise UserError(f"node name {name!r} is not valid: pass --name (lower case, digits, -)")
    labels = _pairs(args.label, "label")
    fabrics = {k: [a for a in v.split(",") if a] for k, v in _pairs(args.fabric, "fabric").items()}
    unknown = [f for f in fabrics if f not in cluster.fabrics]
    if unknown:
        raise UserError(f"--fabric {', '.join(unknown)}: not declared in the cluster's fabrics")
    if not args.prefix.startswith("/") or any(c in args.prefix for c in " \t\n'\"$`\\"):
        raise UserError(f"--prefix {args.prefix!r}: an absolute path without spaces or quotes")
    identity = cluster.cluster.ssh.identity_file
    identity_path = None
    if identity:
        identity_path = Path(identity).expanduser()
        if not identity_path.is_absolute():
            identity_path = args.cluster / identity_path
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    enrolment = enrolments.Enrolment(cluster, args.cluster, target, name, args.prefix,
                                     identity_path, lambda line: print(line, flush=True),
                                     args.wheels)

    def confirm(fingerprint: str) -> bool:
        if not interactive:
            raise UserError(f"{target.known_hosts_name} offers {fingerprint}: compare it with "
                            "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the node's "
                            "console, then pass --fingerprint " + fingerprint)
        answer = input(f"{target.known_hosts_name} offers {fingerprint}. Is this the key the "
                       "node's console shows? [yes/no] ")
        return answer.strip().lower() == "yes"

    async def steps() -> NodeReport:
        await enrolment.pin(args.fingerprint, confirm)
        async with await enrolment.connect() as conn:
            facts = await enrolment.preflight(conn)
            upgraded = await enrolment.install(conn, facts)
            plan = await enrolment.agent(conn, facts, upgraded)
        return await enrolment.first_report(plan)

    try:
        report = asyncio.run(steps())
    except enrolments.EnrolError as exc:
        raise UserError(str(exc)) from None
    plan = enrolment.plan
    assert plan is not None
    if interactive and not fabrics:
        fabrics = _ask_fabrics(report, sorted(cluster.fabrics))
    entry = enrolments.node_entry(target, plan, report, fabrics, labels)
    path = args.cluster / "nodes.yaml"
    before = path.read_text() if path.exists() else ""
    after, diff = yamledits.add_node(before, name, entry)
    if diff:
        path.write_text(after)
        print(f"nodes.yaml {name} written; commit this:\n")
        print(diff, end="")
    else:
        print(f"nodes.yaml {name} unchanged")
    return 0


def _ask_fabrics(report: NodeReport, declared: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for adapter in report.adapters:
        groups.setdefault(adapter.link_layer or "unknown", []).append(adapter.name)
    chosen: dict[str, list[str]] = {}
    for layer, names in sorted(groups.items()):
        if not declared:
            break
        answer = input(f"{layer} adapters {', '.join(names)}: on which fabric? "
                       f"[{'/'.join(declared)}/none] ").strip()
        if answer in declared:
            chosen.setdefault(answer, []).extend(names)
    return chosen
