"""``llmgw validate``: check a cluster directory and summarise it on one screen."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

from llmgw.cli import clusters, engine_cmd
from llmgw.planning import fits
from llmgw.planning import upstreams as planned_upstreams
from llmgw.spec import checks, gpus, loading, secretfiles, upstreams
from llmgw.spec.models import Cluster, Model, Profile
from llmgw.spec.quantities import count, format_duration, format_size


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate", help="check cluster files and summarise the cluster",
        description="Check every *.yaml in the cluster directory: syntax, schema and meaning. "
        "Prints every problem as file:line:col: message and exits 1, or a summary and exits 0. "
        "Warnings (a secret file git tracks, or that lies in the cluster directory or in a "
        "working tree no .gitignore covers) are printed as file:line:col: warning: message "
        "and leave the exit status 0.",
    )
    clusters.add_cluster_flag(parser)
    parser.add_argument("--classes", action="store_true",
                        help="list the known GPU classes and exit")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.classes:
        print(classes_table())
        return 0
    cluster, sources = clusters.load_with_sources(args.cluster)
    errors = (engine_cmd.requirement_file_errors(args.cluster)
              + engine_cmd.declared_requirement_errors(args.cluster, cluster))
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    for warning in warnings(cluster, sources):
        print(warning, file=sys.stderr)
    print(summary(cluster))
    return 0


def warnings(cluster: Cluster, sources: loading.Sources) -> list[loading.SpecError]:
    """What is valid but unwise, located like errors: a secret file that git has or would
    take (:mod:`llmgw.spec.secretfiles`). They do not change the exit status."""
    return sorted((loading.SpecError(sources.locate(p.path, prefer_key=p.at_key),
                                     f"warning: {p.message}")
                   for p in secretfiles.problems(cluster, sources.directory, git_state)),
                  key=lambda e: (e.location or loading.Location("", 0, 0), e.message))


def git_state(path: Path) -> secretfiles.GitState:
    """What git says of ``path``: ``tracked``, ``exposed`` (in a working tree, not
    ignored) or None (ignored, in no repository, or no git here: never an error)."""
    where = path.parent
    if not where.is_dir():
        return None
    def git(*argv: str) -> int | None:
        try:
            return subprocess.run(["git", "-C", str(where), *argv, "--", path.name],
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=10).returncode
        except (OSError, subprocess.SubprocessError):
            return None
    if git("ls-files", "--error-unmatch") == 0:
        return "tracked"
    return "exposed" if git("check-ignore", "-q") == 1 else None  # 0 ignored, 128 no repo


def classes_table() -> str:
    lines = [f"{'CLASS':<16} {'MEMORY':>8} {'CC':>5} {'FP8':>4}  DRIVER NAME"]
    for cls in sorted(gpus.BUILTIN.values(), key=lambda c: c.name):
        cc = ".".join(map(str, cls.compute_capability))
        lines.append(f"{cls.name:<16} {cls.memory_gib:>5} GiB {cc:>5} "
                     f"{'yes' if cls.supports_fp8 else 'no':>4}  {cls.description}")
    return "\n".join(lines)


def describe_profile(profile: Profile) -> str:
    if profile.cpu:
        memory = f", ≥ {profile.min_memory_gb:g} GiB RAM" if profile.min_memory_gb else ""
        return f"{profile.engine} on CPU{memory}"
    where = f"{profile.gpus_per_node}× {'/'.join(profile.gpu_classes)}"
    if profile.nodes > 1:
        where = f"{profile.nodes} nodes × {where}"
    parallel = [f"TP {profile.tensor_parallel}"] if profile.tensor_parallel > 1 else []
    if profile.pipeline_parallel > 1:
        parallel.append(f"PP {profile.pipeline_parallel}")
    shape = f" ({' × '.join(parallel)})" if parallel else ""
    return f"{profile.engine} on {where}{shape}"


def fit_note(cluster: Cluster, model: Model, profile: Profile) -> str:
    """``; fits: 54.0 of 72.0 GiB per GPU at 16k context`` (docs/choosing-models.md)."""
    table = checks.known_classes(cluster)
    known = [table[c] for c in profile.gpu_classes if c in table]
    if profile.cpu or not known or model.shape is None:
        return ""  # no figures declared: nothing to say, and the summary stays as it was
    found = fits.inputs(model, profile)
    figures = fits.estimate(found, known[0], profile.tensor_parallel,
                            profile.pipeline_parallel)
    if figures.need is None:
        return "; fit unknown (the shape gives no size)"
    context = fits.label_context(found.context)
    if figures.fits is None:
        return (f"; fit: at least {fits.gib(figures.need)} of {fits.gib(figures.have)} GiB "
                f"per GPU (KV cache unknown)")
    return (f"; fits: {fits.gib(figures.need)} of {fits.gib(figures.have)} GiB per GPU on "
            f"{known[0].name}{context}")


def summary(cluster: Cluster) -> str:
    """A one-screen overview of a valid cluster."""
    settings = cluster.cluster
    declared: Counter[str] = Counter()
    nodes_with: defaultdict[str, set[str]] = defaultdict(set)
    for name, node in cluster.nodes.items():
        for decl in node.gpus:
            declared[decl.gpu_class] += decl.count
            nodes_with[decl.gpu_class].add(name)
    total_gpus = sum(declared.values())
    lines = [
        f"Cluster {settings.name} is valid: {count(len(cluster.nodes), 'node')}, "
        f"{count(total_gpus, 'GPU')} declared, {count(len(cluster.fabrics), 'fabric')}, "
        f"{count(len(cluster.models), 'model')}, {count(len(cluster.projects), 'project')} "
        f"(sync: {settings.sync}, auth: {settings.auth})",
        "",
        "Nodes",
    ]
    width = max((len(n) for n in cluster.nodes), default=4)
    for name, node in cluster.nodes.items():
        gpu_text = ", ".join(f"{d.count}× {d.gpu_class}" for d in node.gpus) or "no GPUs declared"
        fabric_text = ", ".join(f"{f} ({len(a)})" for f, a in node.fabrics.items()) or "-"
        flags = " [draining]" if node.drain else " [cordoned]" if node.cordoned else ""
        lines.append(f"  {name:<{width}}  {node.address:<15} {gpu_text:<20} fabrics: "
                     f"{fabric_text}{flags}")
    if declared:
        lines += ["", "GPUs by class (declared)"]
        table = checks.known_classes(cluster)
        for cls, number in sorted(declared.items()):
            info = table.get(cls)
            cc = ".".join(map(str, info.compute_capability)) if info else "?"
            lines.append(f"  {cls:<14} {number:>4} on {count(len(nodes_with[cls]), 'node')} "
                         f"(compute capability {cc})")
    if cluster.fabrics:
        lines += ["", "Fabrics"]
        for name, fabric in cluster.fabrics.items():
            members = [n for n, node in cluster.nodes.items() if name in node.fabrics]
            lines.append(f"  {name:<10} {fabric.kind:<10} {count(len(members), 'node')}")
    if cluster.models:
        lines += ["", "Models"]
        for name, model in cluster.models.items():
            scale = model.scaling
            demand = "on demand" if scale.min == 0 else f"min {scale.min}"
            idle = f", idle {format_duration(scale.idle_timeout)}" if scale.idle_timeout else ""
            lines.append(f"  {name}  ({demand}, max {scale.max}{idle})")
            for index, profile in enumerate(model.profiles, 1):
                lines.append(f"    {index}. {describe_profile(profile)}"
                             f"{fit_note(cluster, model, profile)}")
    if cluster.projects:
        lines += ["", "Projects"]
        for name, project in cluster.projects.items():
            budget = "no budget"
            if project.budget_usd is not None:
                budget = f"${project.budget_usd:,.2f}"
            lines.append(f"  {name:<12} {budget}")
    if cluster.upstreams:
        lines += ["", "Upstreams"]
        for name, entry in upstreams.summary(cluster).items():
            lines.append(f"  {name}: {planned_upstreams.describe(entry)}")
    memory = [n for n in cluster.nodes.values() if n.memory]
    if memory:
        lines += ["", f"Declared memory: {format_size(sum(n.memory or 0 for n in memory))} "
                  f"on {count(len(memory), 'node')}"]
    return "\n".join(lines)
