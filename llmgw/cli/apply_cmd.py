"""``llmgw apply [PLANFILE]``: plan, show, confirm, execute — like ``terraform apply``.

Stages: connect (collect every node's report), prepare (plan, or load a
saved plan and re-plan only the nodes whose observation changed), print,
confirm (unless ``--auto-approve``), execute with progress, summarise. A
partial failure prints what changed and what did not, the engine's log tail
for failed replicas, and exits 1; running it again converges.

Models with a ``rollout`` gate are replaced in waves and their new replicas
probed before the old ones go (there is no router in this process to bake on:
``llmgw serve`` does that). A model held after a failed gate is left out of
the plan until ``--retry`` releases it (all held models, or those named).
Under ``sync: auto`` ``--retry`` only releases: the daemon, which applies
there, retries at its next iteration.

Two guards against a second copy of what it cannot see. Replicas a node that
does not answer may still run are not placed elsewhere past ``max``
(``--force`` places them). And under ``sync: auto`` a daemon holding the
store's lease applies by itself: applying beside it races it, so apply says so
and asks at a terminal, refuses elsewhere, unless ``--yes``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from llmgw.applying import executions, records, saved
from llmgw.applying.convergences import Convergence, Finished, Request
from llmgw.applying.executions import Outcome, Step
from llmgw.cli import clusters, engine_cmd
from llmgw.cli.errors import UserError
from llmgw.cli.plan_cmd import revision_of
from llmgw.daemon import leaders
from llmgw.planning import outputs
from llmgw.planning.scaling import Policy
from llmgw.planning.types import Plan
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import parse_duration
from llmgw.spec.rollouts import Hold
from llmgw.store import migrations, stores
from llmgw.store.stores import Store, StoreError
from llmgw.transport import pools


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "apply", help="converge the fleet to the cluster directory",
        description="Plan (or load PLANFILE, saved with `llmgw plan --format json --out`), "
        "print the plan, ask, then start, replace and remove units on the nodes, waiting "
        "for each replica to be Ready. Units being replaced stop only after their "
        "replacement is Ready.",
    )
    parser.add_argument("planfile", nargs="?", type=Path, metavar="PLANFILE",
                        help="a saved JSON plan to apply instead of planning now")
    clusters.add_cluster_flag(parser)
    parser.add_argument("--auto-approve", action="store_true",
                        help="apply without asking for confirmation")
    parser.add_argument("--ready-timeout", default="15m", metavar="DURATION",
                        help="how long a replica may take to become Ready (default: 15m)")
    parser.add_argument("--retry", nargs="*", metavar="MODEL", default=None,
                        help="release the hold of models whose replacement failed its "
                        "rollout gate (all of them, or the MODELs named), then plan")
    parser.add_argument("--force", action="store_true",
                        help="place replicas that a node which does not answer may still "
                        "run (the model may then run over its max until that node is back)")
    parser.add_argument("--yes", action="store_true",
                        help="apply although a daemon applies this cluster under sync: auto "
                        "(without it: asked at a terminal, refused elsewhere)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        ready_timeout = parse_duration(args.ready_timeout)
    except ValueError as exc:
        raise UserError(f"--ready-timeout: {exc}") from None
    cluster = clusters.load(args.cluster)
    try:
        previous = saved.load(args.planfile) if args.planfile else None
    except saved.SavedPlanError as exc:
        raise UserError(str(exc)) from None
    return asyncio.run(_apply(cluster, args, previous, ready_timeout))


async def _apply(
    cluster: Cluster, args: argparse.Namespace, previous: Plan | None, ready_timeout: float
) -> int:
    try:
        store: Store | str = await stores.open_store(cluster.cluster.store)
    except (StoreError, migrations.SchemaTooNew) as exc:
        store = str(exc)  # why it did not open, said where it matters
    try:
        if args.retry is None or cluster.cluster.sync != "auto":
            await _beside_daemon(cluster, store, args.yes, sys.stdout)
        return await _apply_with(cluster, args, previous, ready_timeout, store)
    finally:
        if not isinstance(store, str):
            await store.close()


async def _apply_with(cluster: Cluster, args: argparse.Namespace, previous: Plan | None,
                      ready_timeout: float, store: Store | str) -> int:
    out = sys.stdout
    known = await _holds(cluster, store, args.retry, out)
    if args.retry is not None and cluster.cluster.sync == "auto":
        # The daemon applies under sync: auto; a second applier would race it.
        print("sync is auto: the daemon retries at its next iteration (within "
              f"{cluster.cluster.drift_interval:g} s); watch `llmgw status`.", file=out)
        return 0

    def merged(fresh: Plan) -> Plan:
        if previous is None:
            return fresh
        merge = saved.merge(previous, fresh)
        for node in merge.changed_nodes:
            print(f"! {node}: its observation changed since the plan was saved; its "
                  "changes were re-planned from what it reports now.", file=out)
        return merge.plan

    def replanned(plan: Plan) -> None:
        print("\nPlanned again with the engines installed:", file=out)
        out.write(outputs.text(plan))

    async with pools.Pool(cluster, args.cluster) as pool:
        display = Display(out)
        service = Convergence(
            pool, store=None if isinstance(store, str) else store, ready_timeout=ready_timeout,
            started_by=records.invoker(), progress=display.step,
            install=lambda needs: install(pool, args.cluster, needs, out,
                                          never=never_installed(cluster)))
        request = Request(cluster, revision_of(args.cluster), scope=merged, holds=known,
                          replanned=replanned, policy=Policy(place_unseen=args.force))
        prepared = await service.prepare(request)
        for name, report in sorted(prepared.fleet.nodes.items()):
            if not report.reachable:
                print(f"! {name} is unreachable, nothing will change there: {report.error}",
                      file=out)
        plan = prepared.plan
        out.write(outputs.text(plan))
        if not plan.has_changes and not plan.awaiting_install:
            return 0
        if not args.auto_approve and not _confirm(out):
            print("Apply cancelled.", file=out)
            return 1
        started = await service.start(prepared)
        if started.install_failures:
            print("\nApply stopped before changing anything (every running replica keeps "
                  "running):", file=out)
            for failure in started.install_failures:
                print(f"  {failure}", file=out)
            return 1
        finished = await service.finish(started)
        display.close()
    if finished is None:
        return 0
    _report(finished.outcome, out)
    _journal(finished, out, store)
    return 0 if finished.outcome.ok else 1


async def _beside_daemon(cluster: Cluster, store: Store | str, yes: bool, out: TextIO) -> None:
    """Under ``sync: auto`` the daemon that holds the store's lease applies by itself; a
    second applier races it (and a plan made here may be undone there). Say so; ask at a
    terminal; refuse elsewhere unless ``yes``. Raises UserError when not to go on."""
    if cluster.cluster.sync != "auto":
        return
    try:
        grant = None if isinstance(store, str) else await leaders.leader(store)
    except StoreError as exc:
        store = str(exc)
    if isinstance(store, str):
        print(f"! sync is auto, and whether a daemon applies this cluster is unknown (the "
              f"store: {store})", file=out)
        return
    if grant is None:
        return
    who = leaders.holder_words(grant)
    print(f"! {who} applies this cluster (sync: auto, lease epoch {grant.epoch}): it converges "
          "the fleet to the cluster directory by itself, and may undo or race what this "
          "apply does.", file=out)
    if yes:
        return
    advice = ("commit the change to the cluster directory and let it converge (`llmgw "
              "status` shows it), or pass --yes to apply beside it")
    if not sys.stdin.isatty():
        raise UserError(f"not applying beside {who} (sync: auto): {advice}")
    try:
        answer = input("  Apply beside it anyway? Only 'yes' will be accepted: ")
    except EOFError:
        answer = ""
    if answer.strip() != "yes":
        raise UserError(f"Apply cancelled: {advice}")


async def install(pool: pools.Pool, directory: Path,
                   needs: Mapping[tuple[str, str], set[str]], out: TextIO, *,
                   never: frozenset[str] = frozenset()) -> list[str]:
    """Install the engine versions the plan needs before anything changes; the failures
    (none: all there)."""
    print("\nInstalling engine versions first:", file=out)
    return await engine_cmd.install_missing(
        pool, directory, needs, lambda line: print(f"  {line}", file=out, flush=True),
        never=never)


def never_installed(cluster: Cluster) -> frozenset[str]:
    """Engines whose ``engines.<engine>.install`` is ``never``."""
    return frozenset(e for e, d in cluster.engines.declared() if d.install == "never")


async def _holds(cluster: Cluster, store: Store | str, retry: list[str] | None,
                 out: TextIO) -> list[Hold]:
    """The holds in force, after releasing those ``--retry`` names (all for a bare one)."""
    if isinstance(store, str):
        if retry is not None:
            raise UserError(f"--retry: cannot open the store: {store}")
        return []
    try:
        if retry is not None:
            unknown = sorted(set(retry) - set(cluster.models))
            if unknown:
                raise UserError(f"--retry: no model {', '.join(map(repr, unknown))} in the "
                                "cluster")
            released = await store.release_holds(retry or None)
            for hold in released:
                print(f"released {hold.model} ({hold.line()})", file=out)
            if not released:
                print("nothing was held", file=out)
        return await store.holds()
    except StoreError as exc:
        print(f"! cannot read held revisions: {exc}", file=out)
        return []


def _journal(finished: Finished, out: TextIO, store: Store | str) -> None:
    """What the journal (``llmgw history``) and the holds say of this apply; a store that
    refused only warns."""
    if isinstance(store, str):
        print(f"! the apply was not written to the journal: {store}", file=out)
        return
    if finished.journal_id is None:
        print("! the apply was not written to the journal (see the log)", file=out)
    for error in finished.hold_errors:
        print(f"! {error.replace(': ', ' could not be held: ', 1)}", file=out)
    for hold in finished.held:
        print(f"{hold.model} {hold.line()}; run `llmgw apply --retry {hold.model}` to try it "
              "again", file=out)


def _confirm(out: TextIO) -> bool:
    if not sys.stdin.isatty():
        raise UserError("standard input is not a terminal: pass --auto-approve to apply "
                        "without confirmation")
    print("\nDo you want to apply these changes? Only 'yes' will be accepted.", file=out)
    try:
        answer = input("  Enter a value: ")
    except EOFError:
        return False
    return answer.strip() == "yes"


class Display:
    """Progress per replica: a live table in a terminal, one line per step elsewhere."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = out.isatty()
        self.rows: dict[tuple[str, str], str] = {}
        self.drawn = 0

    def step(self, step: Step) -> None:
        change = step.change
        line = (f"{outputs.symbol(change)} {change.model} r{change.replica}  "
                f"{step.node}  {step.unit}  {step.state}  ({step.elapsed:.1f}s)"
                + (f"  {step.detail}" if step.detail and step.state in (
                    "failed", "gating", "promoted", "rolled back") else ""))
        if not self.live:
            print(line, file=self.out, flush=True)
            return
        self.rows[(step.node, step.unit)] = line
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F")
        for row in self.rows.values():
            self.out.write(f"\x1b[2K{row}\n")
        self.drawn = len(self.rows)
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


def _report(outcome: Outcome, out: TextIO) -> None:
    print(f"\n{outcome.summary()}", file=out)
    for item in outcome.changes:
        change = item.change
        mark = "ok" if item.ok else "FAILED"
        print(f"  {outputs.symbol(change)} {change.action} {change.model} r{change.replica}: "
              f"{mark}", file=out)
        for error in item.errors:
            print(f"      {error}", file=out)
        if item.kept_old:
            print("      the replica it replaces keeps running", file=out)
        for unit, lines in item.logs.items():
            print(f"      last lines of {unit}:", file=out)
            for line in lines[-executions.LOG_LINES:]:
                print(f"        | {line}", file=out)
    if not outcome.ok:
        print("\nRun `llmgw apply` again to retry what failed; what succeeded stays.", file=out)
