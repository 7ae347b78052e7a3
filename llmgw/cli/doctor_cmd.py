"""``llmgw doctor [NODE…]``: check each node for what serving needs, with the fix for each problem.

Asks every named node's agent (all nodes by default) for its report, over
SSH as ``inventory`` does, and runs :mod:`llmgw.onboarding.doctors`' checks on
it. Exit status 1 when any check fails; warnings alone exit 0.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from llmgw import __version__
from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.cli.inventory_cmd import add_timeout_flag, collect
from llmgw.onboarding import doctors

MARKS = {"ok": "ok  ", "warning": "WARN", "fail": "FAIL"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check nodes for what serving needs, with the fix for each problem",
        description="Reach each node's agent and check SSH and the pinned key, root or sudo, "
        "the agent's version, the NVIDIA driver, GPU health (ECC, foreign processes, MIG, "
        "persistence mode), RDMA adapters, "
        "ports and RoCE GIDs against the declared fabrics, the memlock limit, engines, whether "
        "each vLLM or SGLang version the cluster names can be installed, free "
        "disk in weights directories, clock skew, the engine port range and Python. Exits 1 "
        "when any check fails.",
    )
    parser.add_argument("nodes", nargs="*", metavar="NODE", help="nodes to check (default: all)")
    clusters.add_cluster_flag(parser)
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    add_timeout_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    unknown = [n for n in args.nodes if n not in cluster.nodes]
    if unknown:
        known = ", ".join(sorted(cluster.nodes)) or "none"
        raise UserError(f"no node named {', '.join(unknown)} in {args.cluster} (nodes: {known})")
    chosen = args.nodes or sorted(cluster.nodes)
    subset = cluster.model_copy(update={"nodes": {n: cluster.nodes[n] for n in chosen}})
    fleet = collect(subset, args.cluster, args.timeout)
    now = time.time()
    findings = {
        name: doctors.examine(name, cluster.nodes[name], fleet.nodes[name],
                              doctors.context_for(cluster, name, fleet.nodes[name],
                                                  version=__version__, now=now))
        for name in chosen
    }
    failing = any(doctors.failed(f) for f in findings.values())
    if args.json:
        print(json.dumps({"format_version": 1, "failed": failing,
                          "nodes": {n: [asdict(f) for f in fs] for n, fs in findings.items()}},
                         indent=2))
        return 1 if failing else 0
    width = max(len(check) for check, _ in doctors.CHECKS)
    for name, node_findings in findings.items():
        print(name)
        for finding in node_findings:
            print(f"  {MARKS[finding.status]}  {finding.check:<{width}}  {finding.detail}")
            if finding.fix:
                print(f"        {'':<{width}}  fix: {finding.fix}")
    counts = {s: sum(f.status == s for fs in findings.values() for f in fs)
              for s in ("fail", "warning")}
    bad = sum(doctors.failed(fs) for fs in findings.values())
    print(f"\n{len(findings)} node{'s' if len(findings) != 1 else ''} checked: "
          f"{counts['fail']} failed, {counts['warning']} warning"
          + ("" if counts["warning"] == 1 else "s")
          + (f" ({bad} of {len(findings)} nodes failing)" if len(findings) > 1 and bad else "")
          + ".")
    return 1 if failing else 0
