"""``llmgw node remove NAME``: drain a node, then take it out of ``cluster/nodes.yaml``.

Steps, each one line (:mod:`llmgw.onboarding.removals` has the rules):

1. **plan** — every node's report, and a plan with the node draining. A
   model whose every replica is on the node and fits nowhere else would be
   left unservable: refused, nothing changed, unless ``--force``. So is an
   unreachable node (nothing there can be moved or removed).
2. **drain** — ``drain: true`` written into nodes.yaml (comments and order
   kept; diff printed), then the moves applied: each replica created on
   another node and Ready before its units here are removed.
3. **units** — whatever llmgw unit is still on the node is removed.
4. **remove** — the node's entry deleted from nodes.yaml, the diff printed
   to commit; ``--stop-agent`` stops and disables its agent, ``--uninstall``
   also deletes what ``node add`` installed; then its known_hosts line goes.

The moves run through the same convergence service as ``llmgw apply``
(:mod:`llmgw.applying.convergences`): held models stay held, gated models
are probed before their old replica goes, missing engine versions are
installed first, and the moves are journaled (``llmgw history``).

A failed move stops at step 2 with the node left draining: running the
command again picks up from there.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from llmgw.applying import records
from llmgw.applying.convergences import Convergence, Request
from llmgw.cli import apply_cmd, clusters, engine_cmd
from llmgw.cli.apply_cmd import Display
from llmgw.cli.errors import UserError
from llmgw.cli.plan_cmd import revision_of
from llmgw.onboarding import removals, yamledits
from llmgw.planning import installs, outputs
from llmgw.proto.conversions import UnitChange
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import count, parse_duration
from llmgw.store import migrations, stores
from llmgw.store.stores import Store, StoreError
from llmgw.transport import hostkeys, pools
from llmgw.transport.failures import NodeUnreachable

STOP_TIMEOUT = 30.0  # how long a stopped agent may take to go


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    remove = commands.add_parser(
        "remove", help="drain a node (move its replicas, remove its units), drop it from "
        "nodes.yaml",
        description="Move every replica off the node (each created elsewhere and Ready "
        "before its units here go), remove its remaining units, then delete its entry from "
        "nodes.yaml and its known_hosts line. Refuses when a model would be left with no "
        "replica, unless --force.")
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--force", action="store_true",
                        help="remove it even when a model is left unservable or the node is "
                        "unreachable")
    remove.add_argument("--stop-agent", action="store_true",
                        help="then stop and disable the node's agent")
    remove.add_argument("--uninstall", action="store_true",
                        help="then stop the agent and delete what `node add` installed")
    remove.add_argument("--ready-timeout", default="15m", metavar="DURATION",
                        help="how long a moved replica may take to become Ready (default 15m)")
    clusters.add_cluster_flag(remove)
    remove.set_defaults(handler=run_remove)


def say(line: str) -> None:
    print(line, flush=True)


def run_remove(args: argparse.Namespace) -> int:
    try:
        ready_timeout = parse_duration(args.ready_timeout)
    except ValueError as exc:
        raise UserError(f"--ready-timeout: {exc}") from None
    cluster = clusters.load(args.cluster)
    path = args.cluster / "nodes.yaml"
    try:
        yamledits.set_node_key(path.read_text(), args.name, "drain", True)
    except (OSError, KeyError):
        raise UserError(f"{path}: no node named {args.name!r} there (node remove edits "
                        "nodes.yaml only)") from None
    try:
        return asyncio.run(_remove(cluster, args, ready_timeout))
    except removals.RemoveError as exc:
        raise UserError(str(exc)) from None


async def _remove(cluster: Cluster, args: argparse.Namespace, ready_timeout: float) -> int:
    try:
        store: Store | str = await stores.open_store(cluster.cluster.store)
    except (StoreError, migrations.SchemaTooNew) as exc:
        store = str(exc)  # the moves are made without holds or a journal; said below
    try:
        return await _remove_with(cluster, args, ready_timeout, store)
    finally:
        if not isinstance(store, str):
            await store.close()


async def _remove_with(cluster: Cluster, args: argparse.Namespace, ready_timeout: float,
                       store: Store | str) -> int:
    name: str = args.name
    path = args.cluster / "nodes.yaml"
    stopping = bool(args.stop_agent or args.uninstall)
    async with pools.Pool(cluster, args.cluster) as pool:
        display = Display(sys.stdout)
        # The moves converge like `llmgw apply`: holds, rollout gates, engine installs and
        # the journal, through the same service.
        service = Convergence(
            pool, store=None if isinstance(store, str) else store, ready_timeout=ready_timeout,
            started_by=records.invoker(), progress=display.step,
            install=lambda needs: apply_cmd.install(pool, args.cluster, needs, sys.stdout,
                                                    never=apply_cmd.never_installed(cluster)))
        request = Request(removals.draining(cluster, name), revision_of(args.cluster),
                          scope=lambda plan: removals.moves(plan, name))
        prepared = await service.prepare(request)
        fleet = prepared.fleet
        report = fleet.nodes[name]
        if not report.reachable:
            if stopping:
                raise UserError(f"{name} is unreachable ({report.error}): its agent cannot be "
                                "stopped; nothing was changed. Bring it back, or drop "
                                "--stop-agent/--uninstall (and pass --force) to drop it from "
                                "nodes.yaml anyway")
            if not args.force:
                raise UserError(f"{name} is unreachable ({report.error}): its replicas cannot "
                                "be moved nor its units removed. Bring it back, or pass --force "
                                "to drop it from nodes.yaml anyway (its units keep running "
                                "there until the machine is wiped)")
            say(f"plan       {name} unreachable: nothing moved, its units stay (--force)")
        else:
            moves = prepared.plan
            stuck = removals.stranded(moves, fleet, cluster, name)
            refused = removals.refusals(stuck)
            if refused and not args.force:
                raise UserError(f"removing {name} would leave models unservable; nothing was "
                                "changed:\n  - " + "\n  - ".join(refused) + "\nadd capacity "
                                "for them elsewhere, or pass --force")
            needs = removals.install_needs(moves, fleet.nodes, name)
            _check_installs(args.cluster, needs)
            if stopping:
                await _check_stop(pool, name, args.uninstall)
            say(f"plan       {count(len(report.units), 'unit')} on {name}; "
                f"{count(len(moves.changes), 'replica')} to move first"
                + (f", {len(stuck)} with nowhere to go (--force)" if stuck else ""))
            if needs:  # before the drain is written: a failed install changes nothing
                say("install    engine versions the moves need, first:")
                failures = await engine_cmd.install_missing(
                    pool, args.cluster, needs, lambda line: say(f"  {line}"),
                    never=apply_cmd.never_installed(cluster))
                if failures:
                    raise UserError("installing what the drain needs failed; nothing was "
                                    "changed:\n  - " + "\n  - ".join(failures))
                prepared = await service.prepare(request)  # the moves, engines in place
                moves = prepared.plan
            if report.units:
                _write(path, *yamledits.set_node_key(path.read_text(), name, "drain", True),
                       f"nodes.yaml {name} draining (cordoned: nothing new lands there)")
            if moves.changes:
                sys.stdout.write(outputs.text(moves))
                started = await service.start(prepared)
                finished = await service.finish(started)
                display.close()
                failed = finished.outcome.failed if finished is not None else []
                errors = [*started.install_failures, *(
                    f"{item.change.model} r{item.change.replica}: {error}"
                    for item in failed for error in item.errors)]
                if errors:
                    for error in errors:
                        say(f"  {error}")
                    say(f"drain      failed: {name} stays in nodes.yaml, draining; run "
                        "`llmgw node remove` again once the cause is fixed")
                    return 1
                if finished is not None:
                    say(f"drain      {finished.outcome.summary()}")
            await _remove_units(pool, name)
            if stopping:  # before its entry and key go: that is how it is reached
                await _stop_agent(pool, name, args.uninstall, cluster.cluster.ssh.user)
    _write(path, *yamledits.remove_node(path.read_text(), name),
           f"nodes.yaml {name} removed; commit this")
    node = cluster.nodes[name]
    known_hosts = Path(cluster.cluster.ssh.known_hosts).expanduser()
    if not known_hosts.is_absolute():
        known_hosts = args.cluster / known_hosts
    port = node.ssh_port or cluster.cluster.ssh.port
    if removals.forget_host(known_hosts, node.address, port):
        say(f"host key   {hostkeys.entry(node.address, port)} forgotten in known_hosts")
    return 0


def _check_installs(directory: Path, needs: installs.Lacking) -> None:
    """Each engine version the drain needs can be installed from here (a llama-server to
    ship, a requirements file); else refused before anything changes."""
    problems = []
    for (engine, version), nodes in needs.items():
        try:
            engine_cmd.wanted_for(engine, version, requirements=None if engine == "llama.cpp"
                                  else engine_cmd.requirements_path(directory, engine, version))
        except UserError as exc:
            problems.append(f"{engine} {version} on {', '.join(sorted(nodes))}: {exc}")
    if problems:
        raise UserError("the drain needs engine versions installed first, which cannot be; "
                        "nothing was changed:\n  - " + "\n  - ".join(problems))


async def _check_stop(pool: pools.Pool, name: str, uninstall: bool) -> None:
    """Ask the agent (a dry run) whether it can stop, and uninstall; refused before any
    change when it cannot, or is too old to be asked."""
    try:
        await pool.call(name, lambda agent: agent.shutdown(uninstall=uninstall, dry_run=True))
    except NodeUnreachable as exc:
        raise UserError(f"{name}: its agent cannot be stopped ({_why_not(exc)}); nothing "
                        "was changed") from None


async def _stop_agent(pool: pools.Pool, name: str, uninstall: bool, account: str) -> None:
    """Stop the agent through the agent (``Shutdown``: the daemon's account has no shell),
    wait until it has gone, print what is left for root; raise when it did not stop."""
    try:
        stopped = await pool.call(name, lambda agent: agent.shutdown(uninstall=uninstall,
                                                                     dry_run=False))
    except NodeUnreachable as exc:
        raise removals.RemoveError(f"{name}: its agent was not stopped ({_why_not(exc)}); "
                                   "it stays in nodes.yaml") from None
    deadline = time.monotonic() + STOP_TIMEOUT
    while (await pool.report(name)).reachable:
        if time.monotonic() > deadline:
            raise removals.RemoveError(f"{name}: its agent still answers {STOP_TIMEOUT:g}s "
                                       "after it was asked to stop; it stays in nodes.yaml")
        await asyncio.sleep(0.2)
    say(f"agent      stopped ({stopped.detail})"
        + (f"; it deletes {', '.join(stopped.removed)} as it exits" if stopped.removed
           else ""))
    left = removals.left_for_root(account, stopped.left) if uninstall else []
    if left:
        say("left       for root on the node, where node add made them (the agent does not "
            "remove them):")
        for line in left:
            say(f"             {line}")


def _why_not(exc: NodeUnreachable) -> str:
    text = str(exc)
    if "UNIMPLEMENTED" in text:
        return ("its agent is older than Shutdown: run `llmgw node add` again to upgrade "
                "it, or remove the node without --stop-agent/--uninstall")
    return text.split("FAILED_PRECONDITION: ", 1)[-1]


async def _remove_units(pool: pools.Pool, name: str) -> None:
    """Remove every llmgw unit still on ``name``; raise when one cannot be."""
    left = (await pool.report(name)).units
    if not left:
        say(f"units      none left on {name}")
        return
    changes = [UnitChange(u.name, "", action="remove") for u in left]
    try:
        results = await pool.call(name, lambda agent: agent.apply_units(changes))
    except NodeUnreachable as exc:
        raise removals.RemoveError(f"{name}: units not removed ({exc}); it stays in "
                                   "nodes.yaml, draining") from None
    failed = [f"{r.name}: {r.error}" for r in results if not r.ok]
    if failed:
        raise removals.RemoveError(f"{name}: units not removed: {'; '.join(failed)}; it stays "
                                   "in nodes.yaml, draining")
    say(f"units      {len(left)} removed from {name}: {', '.join(u.name for u in left)}")


def _write(path: Path, after: str, diff: str, line: str) -> None:
    if not diff:
        return
    path.write_text(after)
    say(f"{line}:\n")
    sys.stdout.write(diff)
    say("")
