"""``llmgw keys``: create, list and revoke API keys in the cluster's store, and list or
free the budget reservations of requests in flight (``llmgw keys reservations``).

The store is the one ``cluster.store`` names (the SQLite file at ``path``,
relative to the cluster directory, or the PostgreSQL database at ``url``), the
same one ``llmgw serve`` checks keys against; a key created or revoked here
takes effect on the routers' next request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.router import keycaches
from llmgw.spec.models import Cluster
from llmgw.store import audits, keys, stores
from llmgw.store.reservations import Held
from llmgw.store.stores import Store, StoreError

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "keys", help="create, list and revoke API keys",
        description="API keys for the router. Each key belongs to a project of the cluster "
        "(its budget applies). Keys are stored hashed: a key is shown once, at creation.",
    )
    commands = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)

    create = commands.add_parser("create", help="create a key and print it (once)")
    clusters.add_cluster_flag(create)
    create.add_argument("--project", required=True, help="project the key belongs to")
    create.add_argument("--name", default="", help="a label for people (who or what uses it)")
    create.add_argument("--rpm", type=_per_minute, metavar="N",
                        help="the key's own requests per minute (its project's apply too)")
    create.add_argument("--tpm", type=_per_minute, metavar="N",
                        help="the key's own tokens per minute (its project's apply too)")
    create.set_defaults(handler=run_create)

    listing = commands.add_parser("list", help="list keys (never their secrets)")
    clusters.add_cluster_flag(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=run_list)

    revoke = commands.add_parser("revoke", help="revoke a key; the router refuses it at once")
    clusters.add_cluster_flag(revoke)
    revoke.add_argument("key_id", metavar="ID", help="key id as `keys list` shows it (or the key)")
    revoke.set_defaults(handler=run_revoke)

    limits = commands.add_parser(
        "limits", help="show or change a key's own requests and tokens per minute",
        description="A key's own limits apply beside its project's. Without --rpm or --tpm, "
        "print them; `none` removes one. Routers apply a change as they apply a revocation: "
        f"within {keycaches.REVOCATION_BOUND:g} s.")
    clusters.add_cluster_flag(limits)
    limits.add_argument("key_id", metavar="ID", help="key id as `keys list` shows it (or the key)")
    limits.add_argument("--rpm", type=_per_minute_or_none, metavar="N|none",
                        help="the key's own requests per minute; none: no limit of its own")
    limits.add_argument("--tpm", type=_per_minute_or_none, metavar="N|none",
                        help="the key's own tokens per minute; none: no limit of its own")
    limits.set_defaults(handler=run_limits)

    spent = commands.add_parser(
        "budgets", help="what each project spent this budget period, and when it resets",
        description="Per project: spend in the budget's current period (day, week or month "
        "in its time zone; for ever without one), the budget, and when the period resets. "
        "From the usage rows in the store, as the routers count them.")
    clusters.add_cluster_flag(spent)
    spent.add_argument("--json", action="store_true", help="machine-readable output")
    spent.set_defaults(handler=run_budgets)

    held = commands.add_parser(
        "reservations", help="list the budget reservations of requests in flight, or free them",
        description="Every request of a project with a budget holds a reservation until its "
        "usage row is written. A router that dies leaves its reservations to its heartbeat's "
        "expiry; --release frees them now, billing what their routers recorded.")
    clusters.add_cluster_flag(held)
    freeing = held.add_mutually_exclusive_group()
    freeing.add_argument("--release", metavar="ID", action="append", default=[],
                         help="free this reservation (repeatable)")
    freeing.add_argument("--all", action="store_true", help="free every reservation")
    held.add_argument("--json", action="store_true", help="machine-readable output")
    held.set_defaults(handler=run_reservations)


def store_path(cluster: Cluster, directory: Path) -> str:
    """Where the store is, for messages (a path, or the URL without its password)."""
    settings = cluster.cluster.store
    if settings.url:
        return settings.url
    path = Path(settings.path)
    return str(path if path.is_absolute() else directory / path)


def with_store(cluster: Cluster, work: Callable[[Store], Awaitable[T]]) -> T:
    """Open the cluster's store, run ``work`` on it, close it; UserError when it fails."""
    async def run() -> T:
        store = await stores.open_store(cluster.cluster.store)
        try:
            return await work(store)
        finally:
            await store.close()
    try:
        return asyncio.run(run())
    except (StoreError, RuntimeError) as exc:
        raise UserError(f"cannot use the key store: {exc}") from None


def run_create(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    if args.project not in cluster.projects:
        defined = ", ".join(sorted(cluster.projects)) or "none"
        raise UserError(f"project {args.project!r} is not defined in {args.cluster} "
                        f"(projects: {defined}); add it under `projects:` first")
    created = with_store(cluster, lambda store: keys.create(
        store, args.project, args.name, rpm=args.rpm, tpm=args.tpm))
    with_store(cluster, lambda store: audits.record_cli(store, "key.create", key=created.info.id,
                                                        project=args.project))
    print(created.secret)
    limits = _limits(created.info)
    print(f"created key {created.info.id} for project {args.project}"
          f"{f' ({limits})' if limits != '-' else ''}. It is shown only this once: "
          "store it now.", file=sys.stderr)
    return 0


def run_list(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    listed = with_store(cluster, keys.list_all)
    if args.json:
        print(json.dumps([{
            "id": k.id, "project": k.project, "name": k.name, "created_at": k.created_at,
            "revoked_at": k.revoked_at, "last_used_at": k.last_used_at,
            "rpm": k.rpm, "tpm": k.tpm, "owner": k.owner,
        } for k in listed], indent=2))
        return 0
    if not listed:
        print("no keys yet; create one with `llmgw keys create --project P`", file=sys.stderr)
        return 0
    # OWNER (who made a key on /account) only where some key has one: a cluster without
    # the pages never sees a column of dashes.
    owners = any(k.owner for k in listed)
    rows = [("ID", "PROJECT", "NAME", *(["OWNER"] if owners else []), "CREATED", "LAST USED",
             "LIMITS", "STATE")]
    for k in listed:
        rows.append((k.id, k.project, k.name or "-", *([k.owner or "-"] if owners else []),
                     _when(k.created_at), _when(k.last_used_at) if k.last_used_at else "never",
                     _limits(k), f"revoked {_when(k.revoked_at)}" if k.revoked_at else "active"))
    _table(rows)
    return 0


def run_budgets(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    now = time.time()
    limits = {name: project.limit() for name, project in sorted(cluster.projects.items())}
    starts = {name: period.start(now) for name, (_, period) in limits.items()}
    spent = with_store(cluster, lambda store: store.spend_by_project(starts))
    if args.json:
        print(json.dumps([{
            "project": name, "spent_usd": spent.get(name, 0.0), "budget_usd": usd,
            "period": period.kind, "timezone": period.timezone, "since": starts[name],
            "resets_at": period.resets(now)} for name, (usd, period) in limits.items()],
            indent=2))
        return 0
    if not limits:
        print(f"no projects in {args.cluster}; add them under `projects:`", file=sys.stderr)
        return 0
    rows = [("PROJECT", "SPENT THIS PERIOD", "BUDGET", "USED", "PERIOD", "RESETS")]
    for name, (usd, period) in limits.items():
        used, resets = spent.get(name, 0.0), period.resets(now)
        rows.append((name, _usd(used), "unlimited" if usd is None else _usd(usd),
                     f"{min(999, int(100 * used / usd))} %" if usd else "-", period.describe(),
                     "never" if resets is None else period.instant(resets)))
    _table(rows)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    key_id = keys.key_id_of(args.key_id) or args.key_id

    async def revoke(store: Store) -> tuple[keys.KeyInfo | None, keys.KeyInfo | None]:
        before = {k.id: k for k in await keys.list_all(store)}.get(key_id)
        after = await keys.revoke(store, key_id) if before else None
        if before is not None and before.revoked_at is None:
            await audits.record_cli(store, "key.revoke", key=key_id, project=before.project)
        return before, after

    before, info = with_store(cluster, revoke)
    if before is None:
        raise UserError(f"no key with id {key_id!r} in {store_path(cluster, args.cluster)}; "
                        "`llmgw keys list` shows them")
    assert info is not None and info.revoked_at is not None
    if before.revoked_at is not None:
        print(f"key {key_id} ({info.project}) was already revoked at {_when(info.revoked_at)}")
    else:
        print(f"revoked key {key_id} ({info.project}); routers refuse it within "
              f"{keycaches.REVOCATION_BOUND:g} s")
    return 0


def run_limits(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    key_id = keys.key_id_of(args.key_id) or args.key_id
    changing = args.rpm is not None or args.tpm is not None  # None: not given; 0: none

    async def change(store: Store) -> tuple[keys.KeyInfo | None, keys.KeyInfo | None]:
        before = {k.id: k for k in await keys.list_all(store)}.get(key_id)
        if before is None or before.revoked_at is not None or not changing:
            return before, before
        new_rpm = before.rpm if args.rpm is None else args.rpm or None
        new_tpm = before.tpm if args.tpm is None else args.tpm or None
        if (new_rpm, new_tpm) == (before.rpm, before.tpm):
            return before, before
        after = await keys.set_limits(store, key_id, new_rpm, new_tpm)
        await audits.record_cli(store, "key.limits", key=key_id, project=before.project,
                                rpm=str(new_rpm or "none"), tpm=str(new_tpm or "none"))
        return before, after

    before, after = with_store(cluster, change)
    if before is None or after is None:
        raise UserError(f"no key with id {key_id!r} in {store_path(cluster, args.cluster)}; "
                        "`llmgw keys list` shows them")
    if before.revoked_at is not None and changing:
        raise UserError(f"key {key_id} ({before.project}) was revoked at "
                        f"{_when(before.revoked_at)}: its limits no longer matter; create a "
                        f"new key with `llmgw keys create --project {before.project} --rpm N`")
    shown = _limits(after)
    if after is before:
        print(f"key {key_id} ({after.project}): "
              f"{shown if shown != '-' else 'no limits of its own'}"
              f"{' (unchanged)' if changing else ''}")
    else:
        print(f"key {key_id} ({after.project}): {shown if shown != '-' else 'no limits of its own'}"
              f" (was {_limits(before)}); routers apply it within "
              f"{keycaches.REVOCATION_BOUND:g} s")
    return 0


def run_reservations(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    for rid in args.release:
        if not _RESERVATION_ID.fullmatch(rid):
            raise UserError(f"--release {rid[:40]!r}: a reservation id is 16 hex digits, as "
                            "`llmgw keys reservations` lists them")
    if args.release or args.all:
        return _release(cluster, args)
    listed = with_store(cluster, lambda store: store.list_reservations())
    if args.json:
        print(json.dumps([_held_json(h) for h in listed], indent=2))
        return 0
    if not listed:
        print("no reservations: no request of a project with a budget is in flight",
              file=sys.stderr)
        return 0
    rows = [("ID", "PROJECT", "KEY", "MODEL", "HOLDS", "RECORDED", "SINCE", "ROUTER")]
    for h in listed:
        rows.append((h.id, h.project, h.key_id or "-", h.model or "-", _usd(h.amount),
                     _usd(h.used), _when(h.created_at),
                     f"{h.router or '-'} ({'alive' if h.router_alive else 'not beating'})"))
    _table(rows)
    return 0


def _release(cluster: Cluster, args: argparse.Namespace) -> int:
    ids = None if args.all else list(dict.fromkeys(args.release))
    released = with_store(cluster, lambda store: store.release_reservations(ids))
    with_store(cluster, lambda store: _audit_released(store, released))
    if args.json:
        print(json.dumps([_held_json(h) for h in released], indent=2))
    for h in released:
        print(f"released {h.id} ({h.project}, held {_usd(h.amount)}); billed the "
              f"{_usd(h.used)} its router recorded", file=sys.stderr if args.json else None)
    missing = sorted(set(ids or ()) - {h.id for h in released})
    if missing:
        raise UserError(f"no reservation {', '.join(missing)} in "
                        f"{store_path(cluster, args.cluster)} (settled already, or never "
                        "taken); `llmgw keys reservations` lists them")
    if not released:
        print("no reservations to release", file=sys.stderr)
    return 0


_MOST_PER_MINUTE = 1_000_000_000_000


def _per_minute(text: str) -> int:
    """``--rpm`` / ``--tpm``: a whole number from 1 (argparse reports the error)."""
    if not re.fullmatch(r"[0-9]{1,13}", text) or not 1 <= int(text) <= _MOST_PER_MINUTE:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a whole number of at least 1 (per minute)")
    return int(text)


def _per_minute_or_none(text: str) -> int:
    """``keys limits --rpm/--tpm``: a whole number from 1, or ``none`` (0: remove it)."""
    if text == "none":
        return 0
    try:
        return _per_minute(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number of at least 1 "
                                         "(per minute), nor none") from None


def _limits(k: keys.KeyInfo) -> str:
    """A key's own limits for the table: ``rpm 60, tpm 100000``, or ``-``."""
    parts = [f"{kind} {value}" for kind, value in (("rpm", k.rpm), ("tpm", k.tpm))
             if value is not None]
    return ", ".join(parts) or "-"


async def _audit_released(store: Store, released: Sequence[Held]) -> None:
    for h in released:
        await audits.record_cli(store, "reservation.release", reservation=h.id, project=h.project)


def _held_json(h: Held) -> dict[str, object]:
    return {"id": h.id, "project": h.project, "key_id": h.key_id, "model": h.model,
            "amount_usd": h.amount, "recorded_usd": h.used, "created_at": h.created_at,
            "router": h.router, "router_alive": h.router_alive}


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())


def _usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.6f}"


_RESERVATION_ID = re.compile(r"[0-9a-f]{16}")


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"
