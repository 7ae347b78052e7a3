"""Journal entries from applies: what :func:`executions.execute` did, as the store keeps it.

:func:`entry` turns a plan and its :class:`~llmgw.applying.executions.Outcome`
into a :class:`~llmgw.store.journals.ApplyEntry`; :func:`record` writes it and
is the one place a journal write may fail: the apply already happened, so a
store that refuses is logged and the apply's result stands.

No secrets reach the journal. Plans carry secrets as paths only, and even those
stay out: a ``secret_env`` reason is written without its paths, and every
secret path and every ``NAME=value`` of a secret variable is scrubbed from
error text (an engine's last log line may echo its environment).

Usage::

    started = time.time()
    outcome = await executions.execute(plan, pool)
    await records.record(store, plan, outcome, started, records.invoker())
"""

from __future__ import annotations

import getpass
import logging
import re
import socket
from collections.abc import Mapping

from llmgw.applying.executions import ChangeOutcome, Outcome
from llmgw.fleet import redactions
from llmgw.planning import holds
from llmgw.planning.types import Change, Plan
from llmgw.spec import secrets as shapes
from llmgw.spec.models import Model
from llmgw.spec.rollouts import Hold
from llmgw.store.journals import ApplyEntry, ChangeEntry
from llmgw.store.stores import Store, StoreError

log = logging.getLogger(__name__)

DAEMON = "daemon"
MAX_ERROR = 500
"""Characters of error text kept per change: a reason and a log line, not a log."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def invoker() -> str:
    """``user@host`` for an apply started by hand."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def entry(plan: Plan, outcome: Outcome, started_at: float, started_by: str) -> ApplyEntry:
    """The journal entry of ``plan`` applied with ``outcome``. Purely computational.

    ``gate`` sums the gates up: ``passed`` when every gated change passed, else
    ``failed: MODEL rN: reason`` for each that failed.
    """
    gated = [item for item in outcome.changes if item.gate is not None]
    failed = [item for item in gated if item.rolled_back]
    gate = None
    if gated:
        gate = "; ".join(f"failed: {i.change.model} r{i.change.replica}: "
                         f"{(i.gate or '').removeprefix('failed: ')}" for i in failed) or "passed"
    return ApplyEntry(
        started_at=started_at, duration=outcome.elapsed, revision=plan.revision,
        started_by=started_by, ok=outcome.ok,
        changes=tuple(_change(item) for item in outcome.changes), gate=gate,
    )


def rollback(plan: Plan, outcome: Outcome, started_at: float, started_by: str,
             of: int | None) -> ApplyEntry | None:
    """The journal entry of the rollbacks in ``outcome`` (apply ``of``), or None if none.

    Each rolled-back change is a ``destroy`` of its new replica, whose gate failed;
    the old replica was never touched. Purely computational.
    """
    items = [item for item in outcome.changes if item.rolled_back]
    if not items:
        return None
    first = min(item.rolled_back_at for item in items)
    changes = []
    for item in items:
        change = item.change
        left = item.errors[1:]  # the first is the gate's verdict; more: the removal failed
        changes.append(ChangeEntry(
            model=change.model, replica=change.new_replica if change.new_replica is not None
            else change.replica, action="destroy",
            nodes=tuple(sorted({s.node for s in change.shards})),
            why=f"rollback: r{change.replica}'s replacement failed its gate; r{change.replica} "
                "kept", ok=not left, error=_scrub("; ".join(left), _secrets(change)) or None,
            duration=item.elapsed - item.rolled_back_at, gate=item.gate, rolled_back=True,
        ))
    return ApplyEntry(
        started_at=started_at + first, duration=max(i.elapsed for i in items) - first,
        revision=plan.revision, started_by=started_by, ok=all(c.ok for c in changes),
        changes=tuple(changes), gate=entry(plan, outcome, started_at, started_by).gate,
        rollback_of=of,
    )


def held(plan: Plan, outcome: Outcome, models: Mapping[str, Model], now: float) -> list[Hold]:
    """A hold for each model whose replacement failed its gate in ``outcome``: its spec is
    not replaced again until it changes or ``llmgw apply --retry``. Purely computational."""
    found: dict[str, Hold] = {}
    for item in outcome.changes:
        spec = models.get(item.change.model)
        if item.rolled_back and item.gate is not None and spec is not None:
            found[item.change.model] = Hold(item.change.model, holds.digest(spec), plan.revision,
                                            item.gate.removeprefix("failed: "), now)
    return list(found.values())


async def record(store: Store | None, plan: Plan, outcome: Outcome, started_at: float,
                 started_by: str) -> int | None:
    """Write the entry of this apply, and of its rollbacks when a gate failed; the apply's
    id, or None (logged) when the store refused."""
    if store is None:
        return None
    try:
        apply_id = await store.record_apply(entry(plan, outcome, started_at, started_by))
        undone = rollback(plan, outcome, started_at, started_by, apply_id)
        if undone is not None:
            await store.record_apply(undone)
        return apply_id
    except StoreError as exc:
        log.warning("the apply was not written to the journal: %s", exc)
        return None


def _change(item: ChangeOutcome) -> ChangeEntry:
    change = item.change
    secrets = _secrets(change)
    nodes = sorted({s.node for s in change.shards} | {s.node for s in change.removes})
    why = "; ".join(_reason(reason, secrets) for reason in change.reasons)
    return ChangeEntry(
        model=change.model, replica=change.replica, action=change.action,
        nodes=tuple(nodes), why=why, ok=item.ok,
        error=None if item.ok else _error(item, secrets), duration=item.elapsed,
        new_replica=change.new_replica, drift_class=change.drift, gate=item.gate,
        rolled_back=True if item.rolled_back else None,
    )


def _secrets(change: Change) -> tuple[tuple[str, str], ...]:
    """(variable, path) of every secret the change's new shards read."""
    return tuple(pair for shard in change.shards if shard.files is not None
                 for pair in shard.files.secret_env)


def _reason(reason: str, secrets: tuple[tuple[str, str], ...]) -> str:
    if reason.startswith("secret_env"):
        return "secret_env changed (paths are not journaled)"
    return _scrub(reason, secrets)


def _error(item: ChangeOutcome, secrets: tuple[tuple[str, str], ...]) -> str:
    text = "; ".join(item.errors) or "failed"
    last = [line for lines in item.logs.values() for line in lines if line.strip()]
    if last:
        text += f" | {last[-1].strip()}"
    if item.kept_old:
        text += " (the replica it replaces keeps running)"
    return _scrub(text, secrets)[:MAX_ERROR]


def _scrub(text: str, secrets: tuple[tuple[str, str], ...]) -> str:
    text = _CONTROL.sub(" ", text)
    for name, path in secrets:
        if path:
            text = text.replace(path, "[secret path]")
        text = re.sub(rf"\b{re.escape(name)}\s*[=:]\s*\S+", f"{name}=[secret]", text)
    return shapes.scrub(text)  # and whatever looks like a token: the journal is shown


def document(item: ApplyEntry) -> dict[str, object]:
    """``item`` as JSON for ``llmgw history --json`` and ``GET /api/v1/history``, every
    string scrubbed of secrets (an error quotes what an engine printed)."""
    doc: dict[str, object] = redactions.scrubbed({
        "id": item.id, "started_at": item.started_at, "duration": item.duration,
        "revision": item.revision, "started_by": item.started_by,
        "outcome": "ok" if item.ok else "failed", "gate": item.gate,
        "rollback_of": item.rollback_of,
        "changes": [{
            "model": c.model, "replica": c.replica, "action": c.action, "nodes": list(c.nodes),
            "why": c.why, "outcome": "ok" if c.ok else "failed", "error": c.error,
            "duration": c.duration, "new_replica": c.new_replica, "class": c.drift_class,
            "gate": c.gate, "rolled_back": c.rolled_back,
        } for c in item.changes],
    })
    return doc
