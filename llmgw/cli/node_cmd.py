"""``llmgw node add [USER@]HOST[:PORT]``: pin, check, account, install, start, report,
compiler, fabrics, nodes.yaml.

The steps are :mod:`llmgw.onboarding.enrolments`'. At a terminal they show
as a checklist updated in place (:mod:`.checklists`), the host key
fingerprint is confirmed interactively and each group of RDMA adapters is
assigned to a declared fabric by asking; otherwise each finished step prints
one line and ``--fingerprint`` and ``--fabric`` give the answers. The node's
entry is written into ``cluster/nodes.yaml`` (comments and order kept) and
the diff printed, to commit.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

from llmgw.cli import checklists, clusters, removals
from llmgw.cli.errors import UserError
from llmgw.fleet.types import NodeReport
from llmgw.onboarding import enrolments, preflights, yamledits
from llmgw.spec.models import NAME_PATTERN, Node

DEFAULT_PREFIX = "/opt/llmgw"
STEPS = ("host key", "preflight", "account", "install", "agent", "report", "compiler", "fabrics",
         "nodes.yaml")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("node", help="add a machine to the cluster, or remove one")
    commands = parser.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    add = commands.add_parser(
        "add", help="pin its host key, install and start the agent, add it to nodes.yaml",
        description="Take a machine you can SSH to into the cluster. Stops before changing "
        "anything when the node lacks root/sudo, Python 3.11+ or disk.")
    add.add_argument("target", metavar="[USER@]HOST[:PORT]")
    add.add_argument("--name", help="the node's name (default: the first label of the "
                     "machine's own hostname, read on it)")
    add.add_argument("--continue-past", action="store_true",
                     help="go on past a check that failed but need not stop the install "
                     "(low disk, a GPU fault, an agent warning); nodes.yaml notes it in a "
                     "comment. At a terminal node add asks instead")
    add.add_argument("--no-compiler", action="store_true",
                     help="on a GPU node without gcc or clang, install none (vLLM and SGLang "
                     "installs then refuse the node until one is there)")
    add.add_argument("--fingerprint", metavar="SHA256:…",
                     help="the host key fingerprint to accept (checked on the node's console)")
    add.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help="a label for node_selector (repeatable)")
    add.add_argument("--fabric", action="append", default=[], metavar="NAME=ADAPTER,…",
                     help="the node's adapters on a declared fabric (repeatable)")
    add.add_argument("--weights-dir", action="append", default=[], metavar="DIR",
                     dest="weights_dirs",
                     help="a directory of model weights on the node (repeatable): path "
                     "sources are served from under these only, URL sources fetched into "
                     "the first")
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


def _weights_dirs(values: list[str], host: str) -> list[str]:
    """``--weights-dir`` values as nodes.yaml will hold them, checked as ``validate`` checks."""
    here = Node(address=host).on_this_machine
    dirs: list[str] = []
    for value in values:
        relative = value.startswith(("./", "../"))
        if not (value.startswith("/") or (relative and here)) or any(
                c in value for c in " \t\n'\"$`\\") or "\x00" in value:
            raise UserError(f"--weights-dir {value!r}: an absolute path without spaces or "
                            "quotes (./ or ../, relative to the cluster directory, only for a "
                            "node on this machine)")
        if value not in dirs:
            dirs.append(value)
    return dirs


def run_add(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    try:
        target = enrolments.parse_target(args.target, cluster.cluster.ssh.user,
                                         cluster.cluster.ssh.port)
    except enrolments.EnrolError as exc:
        raise UserError(str(exc)) from None
    name = args.name or ""  # "": the machine's hostname, read at preflight
    if args.name is not None and not re.fullmatch(NAME_PATTERN, name):
        raise UserError(f"node name {name!r} is not valid: pass --name (lower case, digits, -)")
    labels = _pairs(args.label, "label")
    fabrics = {k: [a for a in v.split(",") if a] for k, v in _pairs(args.fabric, "fabric").items()}
    unknown = [f for f in fabrics if f not in cluster.fabrics]
    if unknown:
        raise UserError(f"--fabric {', '.join(unknown)}: not declared in the cluster's fabrics")
    weights_dirs = _weights_dirs(args.weights_dirs, target.host)
    if not args.prefix.startswith("/") or any(c in args.prefix for c in " \t\n'\"$`\\"):
        raise UserError(f"--prefix {args.prefix!r}: an absolute path without spaces or quotes")
    identity = cluster.cluster.ssh.identity_file
    identity_path = None
    if identity:
        identity_path = Path(identity).expanduser()
        if not identity_path.is_absolute():
            identity_path = args.cluster / identity_path
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    steps = checklists.Checklist(sys.stdout, STEPS, live=interactive)

    def go_on(step: str, doubts: list[str]) -> bool:
        if args.continue_past:
            return True
        if not interactive:
            return False
        shown = "; ".join(preflights.one_line(d) for d in doubts)
        answer = steps.ask(f"{shown}: go on past this (nodes.yaml will say so)? [yes/no] ")
        return answer.strip().lower() == "yes"

    enrolment = enrolments.Enrolment(cluster, args.cluster, target, name, args.prefix,
                                     identity_path, steps, args.wheels, go_on=go_on)

    def confirm(fingerprint: str) -> bool:
        if not interactive:
            raise UserError(f"{target.known_hosts_name} offers {fingerprint}: compare it with "
                            "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the node's "
                            "console, then pass --fingerprint " + fingerprint)
        answer = steps.ask(f"{fingerprint}: is this the key the node's console shows "
                           "(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`)? [yes/no] ")
        return answer.strip().lower() == "yes"

    async def run() -> NodeReport:
        await enrolment.pin(args.fingerprint, confirm)
        async with await enrolment.connect() as conn:
            facts = await enrolment.preflight(conn)
            await enrolment.ensure_account(conn, facts)
            upgraded = await enrolment.install(conn, facts)
            plan = await enrolment.agent(conn, facts, upgraded)
            # Still logged in: the report's GPUs say whether a compiler is wanted.
            report = await enrolment.first_report(plan)
            await enrolment.compiler(conn, facts, report, wanted=not args.no_compiler)
        return report

    try:
        try:
            report = asyncio.run(run())
            fabrics = _fabrics(steps, report, fabrics, sorted(cluster.fabrics), interactive)
            plan = enrolment.plan
            assert plan is not None
            entry = enrolments.node_entry(target, plan, report, fabrics, labels, weights_dirs)
            name = enrolment.name
            path = args.cluster / "nodes.yaml"
            before = path.read_text() if path.exists() else ""
            note = [f"node add went on past {doubt}" for doubt in enrolment.passed]
            after, diff = yamledits.add_node(before, name, entry, note)
            if diff:
                path.write_text(after)
            steps.done("nodes.yaml", f"{name} written; commit this:" if diff
                       else f"{name} unchanged")
        except (enrolments.EnrolError, UserError) as exc:
            steps.fail(str(exc))
            raise UserError(str(exc)) from None
        except KeyboardInterrupt:
            steps.fail("interrupted")
            raise
    finally:
        steps.close()
    if diff:
        print()
        print(diff, end="")
    return 0


def _fabrics(steps: checklists.Checklist, report: NodeReport, given: dict[str, list[str]],
             declared: list[str], interactive: bool) -> dict[str, list[str]]:
    """Which declared fabric each of the node's adapters is on: ``--fabric``, else asked per
    group of adapters (by subnet manager or RoCE network) at a terminal, else none (said so)."""
    present = [a.name for a in report.adapters]
    steps.begin("fabrics", "the node's RDMA adapters")
    if given:
        absent = [a for names in given.values() for a in names if a not in present]
        if absent:
            raise UserError(f"--fabric names {', '.join(absent)}, which the node does not have "
                            f"(its adapters: {', '.join(present) or 'none'})")
        steps.done("fabrics", "; ".join(f"{f}: {', '.join(a)}" for f, a in given.items()))
        return given
    if not present or not declared:
        steps.done("fabrics", "no RDMA adapters" if not present else
                   f"{len(present)} RDMA adapters, no fabric declared in the cluster")
        return {}
    if not interactive:
        steps.done("fabrics", f"{', '.join(present)} on no fabric: pass --fabric "
                   f"NAME=ADAPTER,… (declared: {', '.join(declared)})")
        return {}
    groups: dict[tuple[str, str], list[str]] = {}
    for adapter in report.adapters:
        # One question per subnet manager (InfiniBand) or IP network (RoCE): adapters on
        # two subnets are two fabrics even when their link layer is the same.
        subnet = " + ".join(adapter.subnets) or "subnet unknown: no ACTIVE port"
        layer = adapter.link_layer or "unknown link layer"
        groups.setdefault((layer, subnet), []).append(adapter.name)
    chosen: dict[str, list[str]] = {}
    for (layer, subnet), names in sorted(groups.items()):
        question = (f"{layer} adapters {', '.join(names)} ({subnet}): on which fabric? "
                    f"[{'/'.join(declared)}/none] ")
        answer = steps.ask(question).strip()
        while answer not in (*declared, "none", ""):
            answer = steps.ask(f"{answer!r} is not a declared fabric. {question}").strip()
        if answer in declared:
            chosen.setdefault(answer, []).extend(names)
    steps.done("fabrics", "; ".join(f"{f}: {', '.join(a)}" for f, a in chosen.items())
               or "on no fabric (answered none)")
    return chosen
