"""Saved plans (``llmgw plan --format json --out FILE``) read back for ``llmgw apply FILE``.

A saved plan is what a person reviewed. It is applied as saved on every node
whose observation is unchanged since (same fingerprint); changes touching a
node that changed are refused and re-planned from what the node reports now.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmgw.planning import shards
from llmgw.planning.types import (
    ACTIONS,
    FORMAT_VERSION,
    Change,
    NodeFingerprint,
    ObservedShard,
    Plan,
    Shard,
)
from llmgw.rendering.units import UnitFiles
from llmgw.spec import bounds


class SavedPlanError(Exception):
    """The file is not a saved plan this llmgw can apply."""


class EditedError(ValueError):
    """A shard whose unit files or digest are not what its spec renders to."""


@dataclass(frozen=True)
class Merge:
    plan: Plan
    changed_nodes: tuple[str, ...]  # nodes whose observation differs from the saved plan's
    replanned: int  # changes taken from the fresh plan


def load(path: Path) -> Plan:
    """The saved plan in ``path``; SavedPlanError, located, for anything else — a file past
    the size and nesting bounds of :mod:`llmgw.spec.bounds` included."""
    try:
        text = bounds.read_text(path, bounds.JSON_MAX_BYTES)
        bounds.check_json(text)
        data = json.loads(text)
    except bounds.BoundError as exc:
        raise SavedPlanError(f"{path}:{exc.line}:{exc.col}: {exc.message}") from None
    except FileNotFoundError:
        raise SavedPlanError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SavedPlanError(f"{path}: cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SavedPlanError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg} "
                             "(save plans with `llmgw plan --format json --out FILE`)") from None
    try:
        return _plan(data)
    except EditedError as exc:
        raise SavedPlanError(f"{path}: {exc}; plan again") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise SavedPlanError(f"{path}: not a saved llmgw plan ({type(exc).__name__}: {exc})") \
            from None


def _plan(data: dict[str, Any]) -> Plan:
    version = data["format_version"]
    if version != FORMAT_VERSION:
        raise ValueError(f"format_version {version}; this llmgw reads {FORMAT_VERSION}")
    return Plan(
        cluster=data["cluster"],
        now=float(data["now"]),
        revision=data.get("revision"),
        changes=tuple(_change(c) for c in data["changes"]),
        nodes=tuple(NodeFingerprint(n["node"], bool(n["reachable"]), n["digest"])
                    for n in data["nodes"]),
    )


def _change(data: dict[str, Any]) -> Change:
    action = data["action"]
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    model, replica = data["model"], int(data["replica"])
    entries = data["shards"]
    return Change(
        action=action,
        model=model,
        replica=replica,
        reasons=tuple(data["reasons"]),
        strategy=data.get("strategy"),
        new_replica=data.get("new_replica"),
        drift=str(data.get("drift") or "declared_change"),
        evidence=tuple(str(line) for line in data.get("evidence") or ()),
        drain=data.get("drain") is True,
        shards=tuple(
            _checked(Shard(
                model=model, replica=data.get("new_replica") or replica, rank=int(s["rank"]),
                ranks=len(entries), node=s["node"], unit=s["unit"], engine=s["engine"],
                gpu_class=s.get("gpu_class"), gpus=tuple(s["gpus"]), port=s.get("port"),
                digest=s["digest"], spec=s.get("spec") or {},
                files=UnitFiles(s["unit"], s["unit_text"], s["env_text"] or "",
                                tuple(sorted((s.get("secret_env") or {}).items()))),
            ))
            for s in entries
        ),
        removes=tuple(
            ObservedShard(node=r["node"], unit=r["unit"], rank=int(r["rank"]),
                          digest=r["digest"], state=r["state"], port=r.get("port"),
                          gpus=tuple(r.get("gpus") or ()))
            for r in data["removes"]
        ),
    )


def _checked(shard: Shard) -> Shard:
    """The shard, if its digest and unit files are exactly what its spec renders to.

    What a person reviewed is the plan's spec and reasons; a unit text edited
    afterwards (an ``ExecStartPre=`` slipped in) must not reach a node.
    """
    what = f"{shard.unit} (change {shard.model} r{shard.replica})"
    if shards.digest(shard.spec) != shard.digest:
        raise EditedError(f"{what}: its digest is not its spec's; the file was edited")
    if shards.files(replace(shard, files=None)) != shard.files:
        raise EditedError(f"{what}: its unit or env file is not what its spec renders to; "
                          "the file was edited")
    return shard


def nodes_of(change: Change) -> set[str]:
    return {s.node for s in change.shards} | {s.node for s in change.removes}


def merge(saved: Plan, fresh: Plan) -> Merge:
    """The saved plan on unchanged nodes; the fresh plan's changes on nodes that changed.

    A node changed when its fingerprint differs, or when only one of the two
    plans knows it.
    """
    before = {n.node: n.digest for n in saved.nodes}
    after = {n.node: n.digest for n in fresh.nodes}
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if not changed:
        return Merge(saved, (), 0)
    changed_set = set(changed)
    fresh_changes = [c for c in fresh.changes if nodes_of(c) & changed_set]
    taken = {(c.model, c.replica) for c in fresh_changes}
    kept = [c for c in saved.changes
            if not nodes_of(c) & changed_set and (c.model, c.replica) not in taken]
    merged = replace(saved, changes=_ordered([*kept, *fresh_changes]), nodes=fresh.nodes)
    return Merge(merged, tuple(changed), len(fresh_changes))


def _ordered(changes: Iterable[Change]) -> tuple[Change, ...]:
    """Destroys first (they free capacity), then restarts, replaces, creates."""
    order = {"destroy": 0, "restart": 1, "replace": 2, "create": 3}
    return tuple(sorted(changes, key=lambda c: (order[c.action], c.model, c.replica)))
