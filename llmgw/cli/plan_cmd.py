"""``llmgw plan``: what would change, and why — without changing anything.

Reads the cluster directory and the observed fleet — a snapshot file from
``llmgw inventory --json`` (``--observed``, so CI plans without SSH), or a
live collection through the transport — and prints the plan as text,
Markdown (pull request comments) or JSON. With ``--detailed-exitcode`` the
exit status says whether anything would change: 0 nothing, 2 changes, 3
replicas that cannot be placed (with or without changes), 1 error.

A snapshot is planned *as of the moment it was taken* (its latest
``collected_at``), so the same snapshot always gives the same plan.

Models held after a failed rollout gate are read from the store when it
exists (a CI job with the store's URL shows them in the pull request comment);
their replacements are left out and the hold is listed instead.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pydantic

from llmgw.cli import clusters, inventories
from llmgw.cli.errors import UserError
from llmgw.daemon import routetables
from llmgw.daemon.leaders import LEASE
from llmgw.fleet.types import FORMAT_VERSION, Fleet
from llmgw.planning import holds, outputs, plans
from llmgw.planning import upstreams as planned_upstreams
from llmgw.planning.scaling import Policy
from llmgw.planning.types import Plan
from llmgw.spec import bounds
from llmgw.spec import upstreams as spec_upstreams
from llmgw.spec.models import Cluster
from llmgw.spec.rollouts import Hold
from llmgw.store import migrations, stores
from llmgw.store.stores import StoreError
from llmgw.transport import pools

EXIT_CHANGES = 2
EXIT_UNPLACEABLE = 3
FORMATS = {"text": outputs.text, "markdown": outputs.markdown, "json": outputs.json_text}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan", help="show what would change in the fleet, and why",
        description="Compare the cluster directory with the observed fleet and print the "
        "changes that would bring the fleet there, each with its reason; replicas that cannot "
        "be placed say why, node by node. Nothing is changed.",
    )
    clusters.add_cluster_flag(parser)
    parser.add_argument(
        "--observed", metavar="FILE", type=Path,
        help="plan against a fleet snapshot (`llmgw inventory --json`) instead of asking "
        "the nodes now",
    )
    parser.add_argument("--format", choices=sorted(FORMATS), default="text",
                        help="output format (default: text)")
    parser.add_argument("--engine-output", action="store_true",
                        help="markdown: quote what a crashed engine printed (scrubbed of "
                        "secrets, as in every format); without it a crash says which unit "
                        "failed and how, not the engine's lines")
    parser.add_argument("--out", metavar="FILE", type=Path,
                        help="write the plan to FILE instead of standard output")
    parser.add_argument("--force", action="store_true",
                        help="plan as `llmgw apply --force` would: place replicas that a node "
                        "which does not answer may still run")
    parser.add_argument(
        "--detailed-exitcode", action="store_true",
        help="exit 0 when nothing would change, 2 when something would, 3 when replicas "
        "cannot be placed (with or without changes), 1 on error",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    if args.observed is not None:
        fleet = read_snapshot(args.observed)
        now = snapshot_time(fleet)
    else:
        fleet = collect_fleet(cluster, args.cluster)
        now = time.time()
    result = plans.plan(cluster, fleet, now, revision=revision_of(args.cluster),
                        policy=Policy(place_unseen=args.force))
    result, _ = holds.apply(result, dict(cluster.models), read_holds(cluster))
    rendered = (outputs.markdown(result, engine_output=args.engine_output)
                if args.format == "markdown" else FORMATS[args.format](result))
    if cluster.upstreams and args.format != "json":
        found = planned_upstreams.changes(spec_upstreams.summary(cluster),
                                          read_upstreams(cluster))
        section = "\n".join(planned_upstreams.lines(found)) + "\n"
        rendered += section if args.format == "text" else f"\n```\n{section.lstrip()}```\n"
    if args.out is not None:
        try:
            args.out.write_text(rendered)
        except OSError as exc:
            raise UserError(f"cannot write the plan to {args.out}: {exc.strerror}") from None
        print(f"{result.summary()} Written to {args.out}.", file=sys.stderr)
    else:
        sys.stdout.write(rendered)
        if args.format == "text":  # what install: auto does per node, or why not
            sys.stdout.write(inventories.render_engine_installs(cluster, fleet))
    if args.detailed_exitcode:
        return detailed_exitcode(result)
    return 0


def read_upstreams(cluster: Cluster) -> dict[str, Any] | None:
    """The upstreams the leader last published with the routes (what the routers use);
    None when there is no store, no table, or it cannot be read (said on standard error)."""
    settings = cluster.cluster.store
    try:
        target = stores.target_of(settings.url, settings.path, settings.password_file)
    except ValueError:
        return None
    if target.kind == "sqlite" and (target.path is None or not target.path.exists()):
        return None

    async def read() -> dict[str, Any] | None:
        store = await stores.open_target(target)
        try:
            published = await store.published_routes(LEASE)
        finally:
            await store.close()
        return None if published is None else routetables.upstreams_of(published.doc)
    try:
        return asyncio.run(read())
    except (StoreError, migrations.SchemaTooNew) as exc:
        print(f"! the upstreams the routers use are unknown: {exc}", file=sys.stderr)
        return None


def read_holds(cluster: Cluster) -> list[Hold]:
    """The held models in the cluster's store; none when it does not exist or cannot be read
    (said on standard error): a plan never fails, or creates a database, for them."""
    settings = cluster.cluster.store
    try:
        target = stores.target_of(settings.url, settings.path, settings.password_file)
    except ValueError:
        return []
    if target.kind == "sqlite" and (target.path is None or not target.path.exists()):
        return []

    async def read() -> list[Hold]:
        store = await stores.open_target(target)
        try:
            return await store.holds()
        finally:
            await store.close()
    try:
        return asyncio.run(read())
    except (StoreError, migrations.SchemaTooNew) as exc:
        print(f"! held revisions unknown: {exc}", file=sys.stderr)
        return []


def detailed_exitcode(plan: Plan) -> int:
    """3 when replicas cannot be placed (changes or not: CI must not show green),
    2 when something would change, 0 when nothing would."""
    if plan.unplaced:
        return EXIT_UNPLACEABLE
    return EXIT_CHANGES if plan.has_changes else 0


def read_snapshot(path: Path) -> Fleet:
    """A fleet snapshot file, or a UserError saying where it is wrong."""
    try:
        data = bounds.read_text(path, bounds.JSON_MAX_BYTES)
        bounds.check_json(data)
    except bounds.BoundError as exc:
        raise UserError(f"{path}:{exc.line}:{exc.col}: {exc.message}") from None
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (write one with `llmgw inventory --json`)") \
            from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text (write one with `llmgw inventory --json`)") \
            from None
    try:
        fleet = Fleet.model_validate_json(data)
    except pydantic.ValidationError as exc:
        problems = []
        for error in exc.errors()[:10]:
            where = ".".join(str(p) for p in error["loc"]) or "(top level)"
            problems.append(f"{path}: {where}: {error['msg']}")
        more = exc.error_count() - len(problems)
        if more > 0:
            problems.append(f"{path}: …and {more} more problems")
        raise UserError("not a fleet snapshot:\n" + "\n".join(problems)) from None
    if fleet.format_version > FORMAT_VERSION:
        raise UserError(
            f"{path}: format_version {fleet.format_version} is newer than this llmgw reads "
            f"({FORMAT_VERSION}); upgrade llmgw"
        )
    return fleet


def snapshot_time(fleet: Fleet) -> float:
    """When the snapshot was taken: its latest report, else now."""
    times = [r.collected_at for r in fleet.nodes.values() if r.collected_at is not None]
    return max(times) if times else time.time()


def collect_fleet(cluster: Cluster, directory: Path) -> Fleet:
    """Ask every node's agent now, through the transport."""
    return asyncio.run(pools.collect(cluster, directory))


def revision_of(directory: Path) -> str | None:
    """The git revision of the cluster directory (``+dirty`` with local edits), if any."""
    try:
        head = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(directory), "status", "--porcelain", "--", "."],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    revision = head.stdout.strip()
    return revision + ("+dirty" if dirty.stdout.strip() else "")
