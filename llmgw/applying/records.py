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

from llmgw.applying.executions import ChangeOutcome, Outcome
from llmgw.planning.types import Change, Plan
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
    """The journal entry of ``plan`` applied with ``outcome``. Purely computational."""
    return ApplyEntry(
        started_at=started_at, duration=outcome.elapsed, revision=plan.revision,
        started_by=started_by, ok=outcome.ok,
        changes=tuple(_change(item) for item in outcome.changes),
    )


async def record(store: Store | None, plan: Plan, outcome: Outcome, started_at: float,
                 started_by: str) -> int | None:
    """Write the entry of this apply; its id, or None (logged) when the store refused."""
    if store is None:
        return None
    try:
        return await store.record_apply(entry(plan, outcome, started_at, started_by))
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
        new_replica=change.new_replica, drift_class=change.drift,
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
    return text


def document(item: ApplyEntry) -> dict[str, object]:
    """``item`` as JSON for ``llmgw history --json`` and ``GET /api/v1/history``."""
    return {
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
    }
